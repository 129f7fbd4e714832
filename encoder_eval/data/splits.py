"""What a task loader returns: splits as dicts of columns.

A split holds `text`, `text_pair` (pair tasks only) and `label` columns; a ranking split
also `query_id`, `doc_id` and `first_stage_rank`. A loader returns
`(train, per-language dev, per-language test, number of labels, problem type)`.
"""

from __future__ import annotations

Split = dict[str, list]
LoaderResult = tuple[Split, dict[str, Split], dict[str, Split], int, str]
