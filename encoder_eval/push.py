"""`encoder-eval push`: share a results folder as a Hugging Face dataset repository.

Usage::

    # see what would go up: stage the folder, list its files, upload nothing
    encoder-eval push --results-dir results/report --repo my-org/encoder-results --dry-run
    # upload (the token from HF_TOKEN or `hf auth login`); --create makes the repository
    encoder-eval push --results-dir results/report --repo my-org/encoder-results --create
    # into a folder of an existing repository, with the HTML report
    encoder-eval push --results-dir probe_results --repo my-org/encoder-results \\
        --path-in-repo probes --report
    # the model's row as its Hub page's evaluation results: a pull request on the model
    encoder-eval push --results-dir results/report --to-model my-org/my-encoder \\
        --model my-encoder --source-url https://huggingface.co/datasets/my-org/encoder-results
    # the protocol as a Hub benchmark dataset (card + eval.yaml naming the suite's tasks)
    encoder-eval push --benchmark-repo my-org/encoder-eval-protocol --create --dry-run

What goes up: the folder's results (with their predictions files), the selection, the
`summarize` table as json, markdown and csv, optionally the `report` page, and a
manifest; local paths are replaced by `<redacted>` (docs/push.md lists where). The table
is refused as `summarize` refuses it (exit 1) unless `--allow-partial`. One commit, by
`huggingface_hub` (the `push` extra). With `--to-model REPO`, the model's row goes instead
as one `.eval_results/<task>.yaml` per task (`export --format hub-eval-results`) in one
pull request on the model repository. With `--benchmark-repo REPO`, the dataset
repository gets the protocol's benchmark card and `eval.yaml` (`hub_results.benchmark_files`;
no results folder). The library is `encoder_eval.reports.share`.
Exit status: 0 pushed (or staged, with --dry-run); 1 refused or the upload failed; 2 bad
input (HF_HUB_OFFLINE set without --dry-run included).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile

from encoder_eval.core import heap
from encoder_eval.core.errors import (
    EXIT_INCOMPLETE,
    EXIT_OK,
    ArgumentParser,
    HarnessError,
    network_problem,
    one_line,
    report_errors,
    warn_once,
)
from encoder_eval.plans.selection import load_selection
from encoder_eval.reports.hub_results import (
    add_hub_entry_arguments,
    benchmark_files,
    check_hub_entry_arguments,
    check_model_repo,
    check_source_url,
    hub_files,
    link_notes,
    one_model,
)
from encoder_eval.reports.share import (
    EVAL_RESULTS_DIR,
    TableRefused,
    check_path_in_repo,
    check_repo_id,
    hub_offline,
    stage_results,
    upload_benchmark,
    upload_eval_results,
    upload_staged,
)
from encoder_eval.reports.table import build_table
from encoder_eval.reports.table_loading import (
    add_table_arguments,
    one_results_dir,
    print_refusal,
    table_of_args,
)
from encoder_eval.reports.table_render import format_refusal


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="encoder-eval push",
        description="Upload a results folder (results, selection, table, optionally the "
        "report page; local paths redacted) to a Hugging Face dataset repository.",
    )
    add_table_arguments(
        p,
        allow_partial="push despite the table's problems (the table carries them as footnotes)",
        results_dir="report-phase (or probe) result directory",
        filters=False,
        several=False,
        required=False,
    )
    dest = p.add_mutually_exclusive_group(required=True)
    dest.add_argument("--repo", help="the dataset repository, as org/name")
    dest.add_argument(
        "--to-model",
        metavar="REPO",
        help="instead: open a pull request on this model repository (org/name) adding "
        "the model's row as the Hub's evaluation results (.eval_results/<task>.yaml)",
    )
    dest.add_argument(
        "--benchmark-repo",
        metavar="REPO",
        help="instead: write the protocol's benchmark dataset card (README.md) and "
        "eval.yaml (the suite's tasks) to this dataset repository (org/name; --create to "
        "make it); no --results-dir. The Hub links entries to it once it accepts it as a "
        "Benchmark",
    )
    p.add_argument(
        "--model",
        help="with --to-model: the table's model whose row goes up (default: its only one)",
    )
    p.add_argument(
        "--source-url",
        help="with --to-model: the https link each entry's source names (where the "
        "results can be read, e.g. the dataset repository of --repo)",
    )
    add_hub_entry_arguments(p, "with --to-model")
    p.add_argument(
        "--path-in-repo", help="a folder of the repository to upload into (default: its root)"
    )
    p.add_argument("--revision", help="the branch to commit to (default: the repository's main)")
    p.add_argument("--message", help="the commit message (default: names the file count)")
    p.add_argument(
        "--create",
        action="store_true",
        help="create the dataset repository if it does not exist",
    )
    p.add_argument("--private", action="store_true", help="with --create: a private repository")
    p.add_argument("--report", action="store_true", help="also upload the HTML report page")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="stage and list the files, print the staging folder, upload nothing "
        "(--to-model: list the files with their contents)",
    )
    p.add_argument(
        "--token",
        help="a Hub token with write access (default: huggingface_hub's own, HF_TOKEN or "
        "the login; prefer those: a command line is visible to other users)",
    )
    return p


def _check(args: argparse.Namespace) -> dict | None:
    """Every refusal that needs no work, before any file is staged; returns the
    benchmark table of --to-model's entries."""
    if args.benchmark_repo:
        if args.results_dir or args.selection or args.allow_partial:
            raise HarnessError(
                "--benchmark-repo writes the protocol's benchmark card and eval.yaml, from "
                "no results: drop --results-dir, --selection and --allow-partial"
            )
    elif not args.results_dir:
        raise HarnessError("push needs --results-dir (report-phase result directory)")
    else:
        one_results_dir(
            args,
            "push",
            "push each folder on its own, each into its own --path-in-repo",
        )
    benchmarks = check_hub_entry_arguments(args, bool(args.to_model), "--to-model")
    if args.benchmark_repo:
        check_repo_id(args.benchmark_repo, "--benchmark-repo")
        if args.model or args.source_url or args.report or args.path_in_repo:
            raise HarnessError(
                "--model, --source-url, --report and --path-in-repo are not for "
                "--benchmark-repo (its card and eval.yaml go to the repository's root)"
            )
    elif args.to_model:
        check_repo_id(args.to_model, "--to-model")
        check_source_url(args.source_url)
        flags = ("create", "private", "report", "path_in_repo")
        if given := [f"--{f.replace('_', '-')}" for f in flags if getattr(args, f)]:
            raise HarnessError(
                f"{', '.join(given)}: for --repo (a dataset repository) only; --to-model "
                f"opens a pull request adding {EVAL_RESULTS_DIR}/ to the model repository"
            )
    else:
        if args.model or args.source_url:
            raise HarnessError("--model and --source-url are for --to-model")
        check_repo_id(args.repo)
    check_path_in_repo(args.path_in_repo)
    if args.private and not args.create:
        raise HarnessError(
            "--private sets the visibility of a repository push creates; add --create "
            "(an existing repository keeps its visibility)"
        )
    if args.dry_run:
        return benchmarks
    if hub_offline():
        raise HarnessError(
            "HF_HUB_OFFLINE is set: push uploads to the Hub; unset it, or pass --dry-run "
            "to stage and list the files only"
        )
    if importlib.util.find_spec("huggingface_hub") is None:
        raise HarnessError("push needs huggingface_hub: pip install 'encoder-eval-harness[push]'")
    return benchmarks


def _stage(args: argparse.Namespace, folder: str):
    return stage_results(
        args.results_dir,
        folder,
        selection=args.selection,
        report=args.report,
        allow_partial=args.allow_partial,
        warn=warn_once(),
    )


def _push_benchmark(args: argparse.Namespace) -> int:
    """`--benchmark-repo`: the protocol's benchmark card and eval.yaml, in one commit."""
    files = benchmark_files()
    where = f"datasets/{args.benchmark_repo}"
    for name, text in files.items():
        print(name)
        if args.dry_run:
            print("".join(f"    {line}\n" for line in text.splitlines()), end="")
    note = (
        f"the Hub links .eval_results entries with dataset.id {args.benchmark_repo} to a "
        "leaderboard only once it accepts the dataset as a Benchmark (it validates "
        "eval.yaml at push time; allow-listing is on request, docs/push.md)"
    )
    if args.dry_run:
        print(f"dry run: nothing uploaded to {where}; {note}", file=sys.stderr)
        return EXIT_OK
    try:
        url = upload_benchmark(files, args.benchmark_repo, revision=args.revision,
                               commit_message=args.message, create=args.create,
                               private=args.private, token=args.token)  # fmt: skip
    except HarnessError:
        raise
    except Exception as exc:  # the Hub's and the network's errors: one line, no trace
        print(f"error: the upload to {where} failed: {_hub_error(exc, args.token)}",
              file=sys.stderr)  # fmt: skip
        return EXIT_INCOMPLETE
    print(f"pushed {len(files)} file(s) to {where}: {url}; {note}", file=sys.stderr)
    return EXIT_OK


def _push_to_model(args: argparse.Namespace, benchmarks: dict | None) -> int:
    """`--to-model`: the model's row as `.eval_results/` files, in one pull request."""
    loaded = table_of_args(args, warn_once())
    model = one_model(loaded.table, args.model)
    # The model's row alone: another model's problems do not hold this one back.
    table = build_table(loaded.results, load_selection(loaded.selection_path), models=[model])
    if print_refusal(table, args.allow_partial, "push"):
        return EXIT_INCOMPLETE
    check_model_repo(table, loaded.results, model, args.to_model)
    files = hub_files(table, loaded.results, model, source_url=args.source_url,
                      results_dir=args.results_dir, warn=warn_once(), benchmark=args.benchmark,
                      benchmark_map=benchmarks, source_user=args.source_user,
                      source_org=args.source_org)  # fmt: skip
    where = f"{args.to_model} (a pull request)"
    for name, text in files.items():
        print(f"{EVAL_RESULTS_DIR}/{name}")
        if args.dry_run:
            print("".join(f"    {line}\n" for line in text.splitlines()), end="")
    for line in link_notes(files, args.benchmark, benchmarks):
        print(line, file=sys.stderr)
    if args.dry_run:
        print(f"dry run: nothing uploaded to {where}", file=sys.stderr)
        return EXIT_OK
    try:
        url = upload_eval_results(files, args.to_model, revision=args.revision,
                                  commit_message=args.message, token=args.token)  # fmt: skip
    except HarnessError:
        raise
    except Exception as exc:  # the Hub's and the network's errors: one line, no trace
        message = _hub_error(exc, args.token)
        print(f"error: the pull request on {args.to_model} failed: {message}", file=sys.stderr)
        return EXIT_INCOMPLETE
    print(f"opened a pull request on {where} with {len(files)} file(s): {url}", file=sys.stderr)
    return EXIT_OK


def _hub_error(exc: Exception, token: str | None) -> str:
    """A Hub or network error as one line, with the token never in it; a Hub that cannot be
    reached says so, where it was looked for and why, without the client's exception."""
    reason = network_problem(exc)
    if reason == "OfflineModeIsEnabled":  # TRANSFORMERS_OFFLINE, which huggingface_hub reads
        message = (
            "huggingface_hub is in offline mode (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is "
            "set): unset it, or pass --dry-run to stage and list the files only"
        )
    elif reason is not None:
        from huggingface_hub import constants

        message = (
            f"cannot reach the Hub at {constants.ENDPOINT} ({reason}); check the network "
            "(and HF_ENDPOINT, if set), then run the same command again"
        )
    else:
        message = one_line(f"{type(exc).__name__}: {exc}")
    return message.replace(token, "<token>") if token else message


@report_errors
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    benchmarks = _check(args)
    if args.benchmark_repo:
        return _push_benchmark(args)
    if args.to_model:
        return _push_to_model(args, benchmarks)
    where = f"datasets/{args.repo}" + (f"/{args.path_in_repo}" if args.path_in_repo else "")
    heap.keep_large_blocks()  # the staged table's marks resample (core/heap.py)
    with tempfile.TemporaryDirectory(prefix="encoder-eval-push-") as tmp:
        folder = tempfile.mkdtemp(prefix="encoder-eval-push-") if args.dry_run else tmp
        try:
            staged = _stage(args, folder)
        except BaseException as exc:
            if args.dry_run:  # nothing half-staged is left behind
                shutil.rmtree(folder, ignore_errors=True)
            if not isinstance(exc, TableRefused):
                raise
            print(
                format_refusal(exc.table).replace(
                    "summarize refuses to print this table", "push refuses this table"
                ),
                file=sys.stderr,
            )
            return EXIT_INCOMPLETE
        for name in staged.files:
            fields = staged.redacted.get(name)
            print(f"{name}  (redacted: {', '.join(fields)})" if fields else name)
        if args.dry_run:
            print(
                f"staged {len(staged.files)} file(s) in {folder} (dry run: nothing uploaded "
                f"to {where})",
                file=sys.stderr,
            )
            return EXIT_OK
        try:
            url = upload_staged(
                staged,
                args.repo,
                path_in_repo=args.path_in_repo,
                revision=args.revision,
                commit_message=args.message,
                create=args.create,
                private=args.private,
                token=args.token,
            )
        except HarnessError:
            raise
        except Exception as exc:  # the Hub's and the network's errors: one line, no trace
            print(f"error: the upload to {where} failed: {_hub_error(exc, args.token)}",
                  file=sys.stderr)  # fmt: skip
            return EXIT_INCOMPLETE
    print(f"pushed {len(staged.files)} file(s) to {where}: {url}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
