"""`--graph-step` (issue 49, item 2) where a CPU can check it: the setting falls back to eager
steps on the CPU with one line and the cell equals a plain eager cell bit for bit, and the
graph step's device-agnostic pieces (the mask form without a host sync, static input
buffers, capturable fused AdamW with the learning rate a tensor, the step function) run
eagerly give the eager step's numbers bit for bit. The capture itself needs a GPU
(bench/gpu_check.py's `graph` stage)."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from encoder_eval.cells import batching, cell_config, devices, graph_step, train
from encoder_eval.cells.encoding import Encoded, autocast
from encoder_eval.cells.kinds import KINDS
from encoder_eval.core.errors import HarnessError
from encoder_eval.core.protocol import Recipe, recipe_fields
from encoder_eval.core.results import result_filename
from encoder_eval.data.loaders import load_model

CPU = torch.device("cpu")


def _cell(root, tiny_models, small_mirror, name: str, **recipe) -> cell_config.CellConfig:
    (root / name).mkdir()
    base = Recipe(max_steps=6, patience=3, max_seq_len=128, precision="fp32", pad_multiple=32)
    return cell_config.CellConfig(
        model_path=str(tiny_models["bert"]), task="glue_rte", lr=1e-4, seed=45, model_key="tiny",
        recipe=dataclasses.replace(base, **recipe), device="cpu", progress="quiet",
        data_dir=str(small_mirror),
        out_json=str(root / name / result_filename("tiny", "glue_rte", 1e-4, 45)),
    )  # fmt: skip


def test_on_the_cpu_the_graph_step_falls_back_in_one_line_and_equals_eager_bit_for_bit(
    tiny_models, small_mirror, tmp_path, capfd
):
    eager = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "eager"))
    capfd.readouterr()
    graphed = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "graph", graph_step=True))
    lines = [line for line in capfd.readouterr().err.splitlines() if "graph-step" in line]
    assert lines == [
        "warning: tiny/glue_rte/lr10/s45: --graph-step: no CUDA graphs on cpu; eager "
        "steps (recorded in recipe.graph_step_run)"
    ]
    assert graphed["recipe"]["graph_step"] is True and eager["recipe"]["graph_step"] is False
    assert graphed["recipe"]["graph_step_run"] == {
        "graphs": 0, "shapes": 0, "fallback": "no CUDA graphs on cpu"}  # fmt: skip
    assert eager["recipe"]["graph_step_run"] is None
    for key in ("dev", "report"):
        assert graphed[key] == eager[key]
    for key in ("dev_history", "final_loss", "steps", "best_step"):
        assert graphed["training"][key] == eager["training"][key], key
    assert "graph_step" in recipe_fields("cell")


def test_graph_step_and_compile_together_are_refused(tiny_models, small_mirror, tmp_path):
    cfg = _cell(tmp_path, tiny_models, small_mirror, "both", graph_step=True, compile=True)
    with pytest.raises(HarnessError, match="--graph-step and --compile"):
        train.run_cell(cfg)


def test_where_the_graph_step_cannot_run_it_says_why(tiny_models):
    model = torch.nn.Linear(2, 2)
    assert graph_step.unavailable(CPU, KINDS["classification"], model) == "no CUDA graphs on cpu"
    if torch.cuda.is_available():
        assert graph_step.unavailable(torch.device("cuda"), KINDS["ranking"], model)


def _batches(seed: int, widths: list[int], rows: int = 8) -> list[dict]:
    """Padded batches of `rows` rows (the widest `w`, random shorter rows), labels 0/1."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for w in widths:
        lengths = torch.randint(3, w + 1, (rows,), generator=g)
        lengths[0] = w
        mask = (torch.arange(w)[None] < lengths[:, None]).long()
        ids = torch.randint(5, 90, (rows, w), generator=g) * mask
        enc = Encoded({"input_ids": ids.tolist(), "attention_mask": mask.tolist()},
                      [0] * rows, lengths.tolist())  # fmt: skip
        batch = {"input_ids": ids, "attention_mask": mask,
                 "labels": torch.randint(0, 2, (rows,), generator=g)}  # fmt: skip
        out.append(batching.Shapes(32, 128).pad(batch, enc, 0))
    return out


def _model(tiny_models, family):
    devices.seed_everything(7)
    model = load_model(str(tiny_models[family]), "auto", 2, "single_label_classification",
                       max_seq_len=128, model_label=family).model  # fmt: skip
    return model.train()


@pytest.mark.parametrize("precision", ["fp32", "bf16-autocast"])
@pytest.mark.parametrize("family", ["bert", "xlm-roberta", "modernbert"])
def test_the_step_function_through_static_buffers_is_the_eager_step_bit_for_bit(
    tiny_models, family, precision
):
    """Six steps over three bucket widths (each met twice: its static buffers refilled),
    dropout on: the eager loop's step (`build_optimizer`, float learning rate, 2-D mask,
    autocast's weight cache) against the graph step's pieces run eagerly (capturable fused
    AdamW, the rate a tensor the scheduler fills, the 3-D mask where the body takes it,
    static buffers, no cache): the same losses, weights and optimizer state, to the bit."""
    recipe = Recipe(precision=precision)
    kind = KINDS["classification"]
    eager_model, graph_model = _model(tiny_models, family), _model(tiny_models, family)
    eager_opt = train.build_optimizer(eager_model, recipe, 1e-4)
    graph_opt = graph_step.graph_optimizer(
        train._param_groups(graph_model, recipe.weight_decay), recipe, 1e-4, CPU
    )
    schedule = train._lr_lambda(2, 6)
    eager_sched = torch.optim.lr_scheduler.LambdaLR(eager_opt, schedule)
    graph_sched = torch.optim.lr_scheduler.LambdaLR(graph_opt, schedule)
    step = graph_step.step_function(kind, graph_model, graph_opt,
                                    lambda: autocast(CPU, precision, cache=False))  # fmt: skip
    statics: dict = {}
    widths = [20, 40, 70, 40, 20, 70]
    for i, batch in enumerate(_batches(3, widths)):
        assert batch["input_ids"].shape[1] in (32, 64, 96)
        rng = torch.get_rng_state()
        eager_opt.zero_grad(set_to_none=True)
        a = kind.train_step(eager_model, dict(batch), 1.0, lambda: autocast(CPU, precision))
        eager_opt.step()
        eager_sched.step()
        torch.set_rng_state(rng)
        shaped = graph_step.graph_mask(graph_model, batch)
        static = statics.setdefault(shaped["input_ids"].shape, graph_step.StaticBatch.like(shaped))
        b = step(static.fill(shaped))  # its gradients zeroed in place, never set to None
        graph_sched.step()
        assert torch.equal(a, b), (i, a, b)
        for p, q in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
            assert torch.equal(p, q), i
    assert len(statics) == 3
    assert all(p.grad is not None for p in graph_model.parameters() if p.requires_grad)
    if family in ("bert", "xlm-roberta"):  # the form without transformers' host sync
        assert shaped["attention_mask"].dim() == 3
    rate = graph_opt.param_groups[0]["lr"]
    assert isinstance(rate, torch.Tensor) and rate.item() == eager_opt.param_groups[0]["lr"]
    for p, q in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
        s, t = eager_opt.state[p], graph_opt.state[q]
        assert torch.equal(s["exp_avg"], t["exp_avg"])
        assert torch.equal(s["exp_avg_sq"], t["exp_avg_sq"])


class _SimulatedGraphs:
    """CUDA graphs stood in for on the CPU: a capture records the step's static batch and runs
    nothing (as a real capture runs no kernel); a replay runs the step on it and writes its
    loss into the captured output. Streams are no-ops. What it checks is `GraphStep`'s own
    bookkeeping: warm-up, capture, replay, static buffers, gradients kept, the fallback."""

    def __init__(self, monkeypatch, fail_capture: bool = False):
        self.capturing, self.fail, self.calls = False, fail_capture, []
        sim = self

        class Stream:
            def __init__(self, *a, **k):
                pass

            def wait_stream(self, other):
                pass

        class Graph:
            def replay(self):
                sim.calls.append("replay")
                self.out.copy_(sim.real(self.static))

            def pool(self):
                return ("pool",)

        @contextlib.contextmanager
        def graph(g, pool=None):
            if sim.fail:
                raise RuntimeError("operation not permitted when stream is capturing")
            sim.capturing, sim.current = True, g
            try:
                yield
            finally:
                sim.capturing = False

        monkeypatch.setattr(torch.cuda, "Stream", Stream)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)

    def wrap(self, step: graph_step.GraphStep) -> None:
        self.real = step.step

        def stepped(static):
            if self.capturing:
                self.calls.append("capture")
                g = self.current
                g.static, g.out = static, torch.zeros(())
                return g.out
            self.calls.append("eager")
            return self.real(static)

        step.step = stepped


@pytest.mark.parametrize("fail_capture", [False, True])
def test_graph_steps_bookkeeping_gives_the_eager_steps_numbers(
    tiny_models, monkeypatch, capfd, fail_capture
):
    """Eight steps over three shapes through `GraphStep.run` with graphs simulated on the
    CPU: a shape's first step runs eagerly, its second is captured and replayed, the rest
    replayed; losses and weights equal the eager loop's to the bit. A capture that fails
    falls back to eager steps for the rest, in one line, and still equals them."""
    sim = _SimulatedGraphs(monkeypatch, fail_capture)
    recipe, kind, precision = Recipe(), KINDS["classification"], "fp32"
    eager_model, graph_model = _model(tiny_models, "bert"), _model(tiny_models, "bert")
    eager_opt = train.build_optimizer(eager_model, recipe, 1e-4)
    graph_opt = graph_step.graph_optimizer(
        train._param_groups(graph_model, recipe.weight_decay), recipe, 1e-4, CPU
    )
    step = graph_step.GraphStep(kind, graph_model, graph_opt,
                                lambda: autocast(CPU, precision, cache=False), CPU, "tiny")  # fmt: skip
    sim.wrap(step)
    for i, batch in enumerate(_batches(5, [20, 40, 20, 70, 20, 40, 40, 70])):
        rng = torch.get_rng_state()
        eager_opt.zero_grad(set_to_none=True)
        a = kind.train_step(eager_model, dict(batch), 1.0, lambda: autocast(CPU, precision))
        eager_opt.step()
        torch.set_rng_state(rng)
        b = step.run(dict(batch)) if step.active(8, 8) else None  # as `train._graph_attempt`
        if b is None:  # fell back: the caller's eager step, on the graph step's optimizer
            graph_opt.zero_grad(set_to_none=False)
            b = kind.train_step(graph_model, dict(batch), 1.0, lambda: autocast(CPU, precision))
            graph_opt.step()
        assert torch.equal(a, b), i
        for p, q in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
            assert torch.equal(p, q), i
    lines = [x for x in capfd.readouterr().err.splitlines() if "graph step off" in x]
    if fail_capture:
        assert sim.calls == ["eager", "eager"]  # the two warm-ups before the failed capture
        assert step.record() == {"graphs": 0, "shapes": 2, "fallback": step.fallback}
        assert step.fallback.startswith("capturing failed (RuntimeError: operation not")
        assert lines == [f"warning: tiny: graph step off, eager steps from here on: "
                         f"{step.fallback}"]  # fmt: skip
        assert not step.active(8, 8)
    else:
        assert sim.calls == ["eager", "eager", "capture", "replay", "eager", "replay",
                             "capture", "replay", "replay", "capture", "replay"]  # fmt: skip
        assert step.record() == {"graphs": 3, "shapes": 3, "fallback": None}
        assert lines == []


def test_a_cell_through_the_simulated_graph_step_equals_the_eager_cell(
    tiny_models, small_mirror, tmp_path, monkeypatch
):
    """The training loop's use of the graph step (`train._graph_setup`, `_graph_attempt`:
    its optimizer, the learning rate a tensor, gradients kept, the first forward's kernel
    watched) on the CPU with CUDA graphs simulated: the same scores, losses and dev history
    as the eager cell, to the bit; what ran is recorded."""
    eager = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "eager"))
    sim = _SimulatedGraphs(monkeypatch)
    made = []
    post_init = graph_step.GraphStep.__post_init__

    def wrapped(self):
        post_init(self)
        sim.wrap(self)
        made.append(self)

    monkeypatch.setattr(graph_step.GraphStep, "__post_init__", wrapped)
    monkeypatch.setattr(graph_step, "unavailable", lambda *a: None)
    graphed = train.run_cell(_cell(tmp_path, tiny_models, small_mirror, "graph", graph_step=True))
    assert len(made) == 1 and "replay" in sim.calls and "capture" in sim.calls
    run = graphed["recipe"]["graph_step_run"]
    assert run["fallback"] is None and run["graphs"] >= 1 and run["shapes"] >= run["graphs"]
    for key in ("dev", "report"):
        assert graphed[key] == eager[key]
    for key in ("dev_history", "final_loss", "steps", "best_step"):
        assert graphed["training"][key] == eager["training"][key], key
    assert graphed["recipe"]["attn_backend"] == eager["recipe"]["attn_backend"]


def test_a_resume_states_float_learning_rate_becomes_a_tensor_again():
    """A resume state (from a cell with or without the setting) puts floats back into the
    optimizer's groups; a float would be baked into a capture, so `hold_lr` makes each one a
    tensor again, of the same value."""
    model = torch.nn.Linear(3, 2)
    opt = graph_step.graph_optimizer(train._param_groups(model, 0.1), Recipe(), 1e-4, CPU)
    step = graph_step.GraphStep(KINDS["classification"], model, opt, lambda: None, CPU, "t")
    for group, value in zip(opt.param_groups, (3e-5, 2e-5), strict=True):
        group["lr"] = value
    step.hold_lr()
    rates = [g["lr"] for g in opt.param_groups]
    assert all(isinstance(r, torch.Tensor) and r.dtype == torch.float64 for r in rates)
    assert [r.item() for r in rates] == [3e-5, 2e-5]
