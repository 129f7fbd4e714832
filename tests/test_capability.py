"""The synthetic capability suite (seed 002): exact reproducibility, the axes' labels checked
against oracle models that know the answers, an untrained tiny decoder near chance, and a few
training steps on the chain moving perplexity."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from encoder_eval.cells import capability
from encoder_eval.cells.capability import (
    AXES,
    MODULUS,
    evaluate_checkpoint,
    markov_chain,
    markov_transition_matrix,
    sample_markov,
)
from encoder_eval.core.errors import HarnessError

VOCAB = 96


def tiny_decoder(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
                         max_position_embeddings=64)  # fmt: skip
    return LlamaForCausalLM(config)


class ChainOracle(torch.nn.Module):
    """The seed's model shape (`.vocab`, ids -> next-token logits) that knows the chain's own
    transition probabilities."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.log_t = torch.tensor(np.log(markov_transition_matrix(vocab) + 1e-300))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.log_t[ids[:, -1]].clone()


class Oracle(ChainOracle):
    """Knows the other answers: the sum mod the modulus, the parity, and the token that
    followed the earlier occurrence of the last one."""

    def __init__(self, vocab: int) -> None:
        super().__init__(vocab)
        sym = capability._symbols(vocab)
        self.numbers = sym[:MODULUS].tolist()
        self.plus, self.equals = int(sym[MODULUS]), int(sym[MODULUS + 1])
        self.bits = sym[MODULUS + 2 :].tolist()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = super().forward(ids)
        for i, row in enumerate(ids.tolist()):
            answer = None
            if len(row) == 4 and row[1] == self.plus and row[3] == self.equals:
                a, b = self.numbers.index(row[0]), self.numbers.index(row[2])
                answer = self.numbers[(a + b) % MODULUS]
            elif row[-1] == self.equals and set(row[:-1]) <= set(self.bits):
                answer = self.bits[sum(self.bits.index(t) for t in row[:-1]) % 2]
            elif row[-1] in row[:-1]:
                answer = row[row.index(row[-1]) + 1]
            if answer is not None:
                out[i, answer] = 100.0
        return out


def test_the_chain_is_fixed_by_the_vocabulary_and_sums_to_one() -> None:
    m = markov_transition_matrix(VOCAB)
    assert m.shape == (VOCAB, VOCAB)
    np.testing.assert_allclose(m.sum(axis=1), 1.0)
    assert ((m > 0).sum(axis=1) == capability.MARKOV_SUCCESSORS).all()
    np.testing.assert_array_equal(m, markov_transition_matrix(VOCAB))
    assert not np.array_equal(m, markov_transition_matrix(VOCAB, seed=1))
    succ, probs = markov_chain(50_000)  # any vocabulary, sparse
    assert succ.shape == probs.shape == (50_000, capability.MARKOV_SUCCESSORS)
    with pytest.raises(HarnessError, match="markov_chain"):
        markov_transition_matrix(50_000)


def test_samples_follow_the_chain() -> None:
    seqs, logp = sample_markov(VOCAB, 2000, 2, np.random.default_rng(3))
    m = markov_transition_matrix(VOCAB)
    np.testing.assert_allclose(logp[:, 0], np.log(m[seqs[:, 0], seqs[:, 1]]))
    # the empirical next-state distribution of the commonest first state matches its row
    first = np.bincount(seqs[:, 0]).argmax()
    nxt = np.bincount(seqs[seqs[:, 0] == first, 1], minlength=VOCAB)
    assert np.abs(nxt / nxt.sum() - m[first]).max() < 0.25


def test_an_oracle_scores_perfectly_and_reaches_the_chains_floor() -> None:
    report = evaluate_checkpoint(Oracle(VOCAB), checkpoint_id="oracle", n_examples=64)
    scores = report.scores()
    assert list(scores) == list(AXES)
    ppl = evaluate_checkpoint(ChainOracle(VOCAB), n_examples=64).tasks[0]
    assert ppl.score == pytest.approx(ppl.details["oracle_perplexity"], rel=1e-6)
    assert ppl.higher_is_better is False
    for name in ("modular_arithmetic", "parity", "induction"):
        assert scores[name] == 1.0, name


def test_the_receipt_is_exactly_reproducible_and_json_ready() -> None:
    import json

    model = tiny_decoder()
    a = evaluate_checkpoint(model, checkpoint_id="c0", seed=7, n_examples=32, metadata={"k": 1})
    b = evaluate_checkpoint(model, checkpoint_id="c0", seed=7, n_examples=32, metadata={"k": 1})
    assert a.report() == b.report()
    assert json.loads(json.dumps(a.report())) == a.report()
    assert a.metadata["k"] == 1 and a.metadata["vocab"] == VOCAB
    c = evaluate_checkpoint(model, checkpoint_id="c0", seed=8, n_examples=32)
    assert c.scores() != a.scores()
    model.train()  # the caller's mode is restored
    evaluate_checkpoint(model, n_examples=4)
    assert model.training


def test_an_untrained_decoder_is_near_chance() -> None:
    n = 256
    report = evaluate_checkpoint(tiny_decoder(), checkpoint_id="init", seed=0, n_examples=n)
    for t in report.tasks[1:]:
        chance = t.details["chance"]
        se = (chance * (1 - chance) / n) ** 0.5
        print(t.name, t.score, chance)
        assert abs(t.score - chance) < 4 * se, (t.name, t.score, chance)
    ppl = report.tasks[0]
    assert 0.5 * VOCAB < ppl.score < 2 * VOCAB  # about uniform over the vocabulary


def test_a_few_training_steps_on_the_chain_lower_perplexity() -> None:
    model = tiny_decoder()
    before = evaluate_checkpoint(model, seed=0, n_examples=64).scores()["perplexity"]
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    rng = np.random.default_rng(123)  # training samples: another stream than the eval's
    model.train()
    for _ in range(30):
        seqs, _ = sample_markov(VOCAB, 32, capability.SEQUENCE_LENGTH, rng)
        x = torch.as_tensor(seqs)
        loss = model(input_ids=x, labels=x).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    after = evaluate_checkpoint(model, seed=0, n_examples=64)
    ppl = after.scores()["perplexity"]
    print("perplexity", before, "->", ppl, "floor", after.tasks[0].details["oracle_perplexity"])
    assert ppl < 0.5 * before
    assert ppl > after.tasks[0].details["oracle_perplexity"] * 0.99


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(HarnessError, match="vocabulary"):
        evaluate_checkpoint(tiny_decoder(), vocab=5)
    with pytest.raises(HarnessError, match="n_examples"):
        evaluate_checkpoint(tiny_decoder(), n_examples=1)


def test_track_kind_synthetic_flags_a_checkpoint_whose_perplexity_regressed(tmp_path) -> None:
    """A ladder of real (tiny) decoder checkpoints: untrained, trained on the chain, and
    untrained again. The third is flagged on perplexity, a lower-is-better score."""
    from encoder_eval import track
    from encoder_eval.core.errors import EXIT_REGRESSED

    trained = tiny_decoder()
    optim = torch.optim.AdamW(trained.parameters(), lr=1e-2)
    rng = np.random.default_rng(123)
    for _ in range(30):
        x = torch.as_tensor(sample_markov(VOCAB, 32, capability.SEQUENCE_LENGTH, rng)[0])
        loss = trained(input_ids=x, labels=x).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    ladder = [("init", tiny_decoder(0)), ("trained", trained), ("reset", tiny_decoder(1))]
    lines = []
    for name, model in ladder:
        model.save_pretrained(tmp_path / name)
        lines.append(f"{name}\t{tmp_path / name}")
    (tmp_path / "ladder.tsv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "track"
    args = ["run", "--checkpoints", str(tmp_path / "ladder.tsv"), "--kind", "synthetic",
            "--n-examples", "64", "--out-dir", str(out), "--no-plots", "--device", "cpu"]  # fmt: skip
    assert track.main(args) == EXIT_REGRESSED
    receipts = track.load_receipts(out)
    assert [r.checkpoint_id for r in receipts] == ["init", "trained", "reset"]
    ppl = [r.task("perplexity").score for r in receipts]
    assert ppl[1] < 0.5 * ppl[0] and ppl[2] > 2 * ppl[1]
    # the receipt is the in-process report, exactly
    again = evaluate_checkpoint(trained, checkpoint_id="trained", seed=0, n_examples=64)
    assert receipts[1].scores() == pytest.approx(again.scores(), rel=1e-6)
    report = json.loads((out / "regression.json").read_text())
    flagged = {(f["task"], f["checkpoint_id"]) for f in report["flags"]}
    assert ("perplexity", "reset") in flagged
    assert all(c != "trained" for _, c in flagged)
    # a rerun evaluates nothing and keeps the receipts
    before = sorted((out / "receipts").iterdir())
    assert track.main(args) == EXIT_REGRESSED
    assert sorted((out / "receipts").iterdir()) == before


def test_track_kind_synthetic_refuses_the_other_kinds_flags(tmp_path) -> None:
    from encoder_eval import track

    with pytest.raises(HarnessError, match="only --seed and --n-examples"):
        track.build_setup("synthetic", ["glue_rte"])
    with pytest.raises(HarnessError, match="is for --kind synthetic"):
        track.build_setup("probe", ["glue_rte"], n_examples=10)
    with pytest.raises(HarnessError, match="needs --tasks"):
        track.build_setup("probe", [])
