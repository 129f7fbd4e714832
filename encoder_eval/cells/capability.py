"""The synthetic capability suite for decoder checkpoints (seed 002), scored in process.

Four narrow axes, each drawn from a fixed, seeded procedure over the model's own token ids,
so a score is exactly reproducible and compares across checkpoints that share a tokenizer:

- `perplexity`: held-out perplexity of sequences from a fixed order-1 Markov chain over the
  vocabulary (lower is better). The chain depends on the vocabulary size and the suite's
  constant seed only, so a training loop may learn it; the call's `seed` picks the samples.
- `modular_arithmetic`: `a + b =` under a small modulus, one next-token prediction.
- `parity`: the XOR parity of a random bit string, one next-token prediction (the number of
  ones is uniform, so the majority bit carries almost no hint).
- `induction`: a bigram `A B` planted once in random context, then `A` again: predict `B`.

The three accuracy axes are scored among their candidate answers only (the modulus's number
tokens, the two bit tokens, the distinct tokens of the context), so chance is known and
recorded (`details.chance`). This is a small, honest proxy, not a published benchmark: it
says nothing about world knowledge or language understanding.

    report = evaluate_checkpoint(model, checkpoint_id="step-1000", seed=0)
    report.scores()   # {"perplexity": ..., "modular_arithmetic": ..., ...}

`evaluate_checkpoint` does no file I/O; `track --kind synthetic` writes its receipts.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from encoder_eval.core.errors import HarnessError
from encoder_eval.core.receipt import TaskResult

SUITE_VERSION = 1
MARKOV_SEED = 20021  # the chain is a property of the suite, not of a call
MARKOV_SUCCESSORS = 8  # each state moves to one of this many states (sparse rows)
DENSE_LIMIT = 8192  # largest vocabulary `markov_transition_matrix` builds densely
SEQUENCE_LENGTH = 32
MODULUS = 7
PARITY_BITS = 16
INDUCTION_CONTEXT = 24
AXES = ("perplexity", "modular_arithmetic", "parity", "induction")
_MIN_VOCAB = MODULUS + 4  # number tokens, '+', '=', and room for the others


@dataclass
class EvalReport:
    """Every axis's score for one checkpoint: the seed's per-rung receipt, JSON-ready."""

    checkpoint_id: str
    tasks: list[TaskResult]
    seed: int
    metadata: dict[str, Any] = field(default_factory=dict)

    def scores(self) -> dict[str, float]:
        """{task name: score}: the compact view a regression rule reads."""
        return {t.name: t.score for t in self.tasks}

    def report(self) -> dict[str, Any]:
        """The receipt as plain JSON-serialisable data."""
        return asdict(self)


# ----------------------------------------------------------------------------- the chain


def markov_chain(vocab: int, seed: int = MARKOV_SEED) -> tuple[np.ndarray, np.ndarray]:
    """The suite's Markov chain as sparse rows: `(successors, probabilities)`, each of shape
    (vocab, MARKOV_SUCCESSORS); row i says where state i moves and with what probability."""
    _check_vocab(vocab)
    rng = np.random.default_rng([seed, vocab])
    k = min(MARKOV_SUCCESSORS, vocab)
    successors = np.stack([rng.choice(vocab, size=k, replace=False) for _ in range(vocab)])
    probs = rng.dirichlet(np.full(k, 0.5), size=vocab)
    return successors.astype(np.int64), probs


def markov_transition_matrix(vocab: int, seed: int = MARKOV_SEED) -> np.ndarray:
    """The fixed order-1 Markov chain the perplexity axis scores against, as a dense
    row-stochastic (vocab, vocab) matrix (`markov_chain` gives the sparse form, for any size)."""
    if vocab > DENSE_LIMIT:
        raise HarnessError(
            f"a dense {vocab}x{vocab} transition matrix is too large; "
            "use markov_chain(vocab) for the sparse rows"
        )
    successors, probs = markov_chain(vocab, seed)
    matrix = np.zeros((vocab, vocab))
    np.put_along_axis(matrix, successors, probs, axis=1)
    return matrix


def sample_markov(
    vocab: int, n: int, length: int, rng: np.random.Generator, chain_seed: int = MARKOV_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """`n` sequences of `length` states drawn from the chain (uniform first state), and the
    chain's own log-probability of each transition (the floor a perfect model reaches)."""
    successors, probs = markov_chain(vocab, chain_seed)
    seqs = np.empty((n, length), dtype=np.int64)
    logp = np.empty((n, length - 1))
    seqs[:, 0] = rng.integers(vocab, size=n)
    cum = np.cumsum(probs, axis=1)
    for t in range(1, length):
        rows = seqs[:, t - 1]
        pick = (rng.random(n)[:, None] > cum[rows]).sum(axis=1).clip(max=cum.shape[1] - 1)
        seqs[:, t] = successors[rows, pick]
        logp[:, t - 1] = np.log(probs[rows, pick])
    return seqs, logp


# ----------------------------------------------------------------------------- the model


class _NextToken:
    """One interface over the two model shapes the suite accepts: a `transformers` causal LM
    (logits of shape (batch, length, vocab)) or the seed's callable with `.vocab` returning
    next-token logits of shape (batch, vocab)."""

    def __init__(self, model: Any, vocab: int | None, batch_size: int) -> None:
        import torch

        self.torch = torch
        self.model = model
        self.batch_size = batch_size
        config = getattr(model, "config", None)
        self.hf = config is not None and hasattr(config, "vocab_size")
        found = config.vocab_size if self.hf else getattr(model, "vocab", None)
        self.vocab = int(vocab or found or 0)
        _check_vocab(self.vocab)
        params = list(model.parameters()) if hasattr(model, "parameters") else []
        self.device = params[0].device if params else torch.device("cpu")

    def _logits(self, ids: np.ndarray) -> Any:
        x = self.torch.as_tensor(ids, device=self.device)
        if self.hf:
            return self.model(input_ids=x).logits.float()
        return self.model(x).float()

    def last(self, ids: np.ndarray) -> np.ndarray:
        """Next-token log-probabilities after each row: (batch, vocab)."""
        out = []
        for i in range(0, len(ids), self.batch_size):
            logits = self._logits(ids[i : i + self.batch_size])
            logits = logits[:, -1, :] if logits.dim() == 3 else logits
            out.append(self.torch.log_softmax(logits[:, : self.vocab], -1).cpu().numpy())
        return np.concatenate(out)

    def every(self, ids: np.ndarray) -> np.ndarray:
        """Log-probability of token t+1 given tokens <= t, for every t: (batch, length-1)."""
        if not self.hf:  # the seed's callable scores one position at a time
            cols = [
                self.last(ids[:, : t + 1])[np.arange(len(ids)), ids[:, t + 1]]
                for t in range(ids.shape[1] - 1)
            ]
            return np.stack(cols, axis=1)
        out = []
        for i in range(0, len(ids), self.batch_size):
            chunk = ids[i : i + self.batch_size]
            logp = self.torch.log_softmax(self._logits(chunk)[:, :-1, : self.vocab], -1)
            target = self.torch.as_tensor(chunk[:, 1:], device=logp.device)
            out.append(logp.gather(-1, target[..., None])[..., 0].cpu().numpy())
        return np.concatenate(out)


def _check_vocab(vocab: int) -> None:
    if vocab < _MIN_VOCAB:
        raise HarnessError(
            f"the capability suite needs a vocabulary of at least {_MIN_VOCAB} tokens; got {vocab}"
        )


def _symbols(vocab: int) -> np.ndarray:
    """The distinct token ids the suite uses as its symbols, in order: the modulus's numbers,
    '+', '=', then the two bits. Fixed per vocabulary size, so every checkpoint of one
    tokenizer sees the same ones."""
    rng = np.random.default_rng([MARKOV_SEED, vocab, 1])
    return rng.choice(vocab, size=MODULUS + 4, replace=False)


# ----------------------------------------------------------------------------- the axes


def _accuracy(name: str, correct: np.ndarray, chance: float, extra: dict) -> TaskResult:
    acc = float(correct.mean())
    return TaskResult(
        name,
        acc,
        True,
        len(correct),
        {
            "std": float(correct.std(ddof=1)) if len(correct) > 1 else None,
            "n": len(correct),
            "chance": chance,
            **extra,
        },
    )


def _perplexity(lm: _NextToken, rng: np.random.Generator, n: int) -> TaskResult:
    seqs, oracle = sample_markov(lm.vocab, n, SEQUENCE_LENGTH, rng)
    nll = -lm.every(seqs).mean(axis=1)  # per sequence
    ppl = math.exp(float(nll.mean()))
    # std on the score's scale (delta method), so the noise rule reads perplexity units
    std = ppl * float(nll.std(ddof=1)) if n > 1 else None
    return TaskResult(
        "perplexity",
        ppl,
        False,
        n,
        {
            "std": std,
            "n": n,
            "oracle_perplexity": math.exp(float(-oracle.mean())),
            "uniform_perplexity": float(lm.vocab),
            "sequence_length": SEQUENCE_LENGTH,
            "markov_seed": MARKOV_SEED,
            "markov_successors": MARKOV_SUCCESSORS,
        },
    )


def _arithmetic(lm: _NextToken, rng: np.random.Generator, n: int) -> TaskResult:
    sym = _symbols(lm.vocab)
    numbers, plus, equals = sym[:MODULUS], sym[MODULUS], sym[MODULUS + 1]
    a, b = rng.integers(MODULUS, size=n), rng.integers(MODULUS, size=n)
    prompts = np.stack([numbers[a], np.full(n, plus), numbers[b], np.full(n, equals)], axis=1)
    guess = lm.last(prompts)[:, numbers].argmax(axis=1)
    return _accuracy(
        "modular_arithmetic", guess == (a + b) % MODULUS, 1 / MODULUS, {"modulus": MODULUS}
    )


def _parity(lm: _NextToken, rng: np.random.Generator, n: int) -> TaskResult:
    sym = _symbols(lm.vocab)
    bits_tok, equals = sym[MODULUS + 2 :], sym[MODULUS + 1]
    # The count of ones is uniform over 0..PARITY_BITS, so a function of the majority (what
    # an untrained network tends to echo) agrees with the parity about half the time.
    ones = rng.integers(PARITY_BITS + 1, size=n)
    bits = (rng.random((n, PARITY_BITS)).argsort(axis=1) < ones[:, None]).astype(np.int64)
    prompts = np.concatenate([bits_tok[bits], np.full((n, 1), equals)], axis=1)
    guess = lm.last(prompts)[:, bits_tok].argmax(axis=1)
    return _accuracy("parity", guess == bits.sum(axis=1) % 2, 0.5, {"bits": PARITY_BITS})


def _induction(lm: _NextToken, rng: np.random.Generator, n: int) -> TaskResult:
    length = INDUCTION_CONTEXT
    prompts = rng.integers(lm.vocab, size=(n, length + 1))
    answers, candidates = np.empty(n, dtype=np.int64), []
    for i, row in enumerate(prompts):
        a = row[-1]
        context = row[:length]
        context[context == a] = (a + 1) % lm.vocab  # A occurs only where it is planted
        pos = rng.integers(0, length - 2)  # A B inside the context, never at its end
        context[pos] = a
        answers[i] = context[pos + 1]
        candidates.append(np.unique(context))
    logp = lm.last(prompts)
    correct = np.array([c[logp[i, c].argmax()] == answers[i] for i, c in enumerate(candidates)])
    chance = float(np.mean([1 / len(c) for c in candidates]))
    return _accuracy("induction", correct, chance, {"context": length})


_AXES: dict[str, Callable[[_NextToken, np.random.Generator, int], TaskResult]] = {
    "perplexity": _perplexity,
    "modular_arithmetic": _arithmetic,
    "parity": _parity,
    "induction": _induction,
}


def evaluate_checkpoint(
    model: Any,
    *,
    checkpoint_id: str = "checkpoint",
    seed: int = 0,
    n_examples: int = 256,
    metadata: dict[str, Any] | None = None,
    vocab: int | None = None,
    batch_size: int = 64,
) -> EvalReport:
    """Run the whole suite on `model` and return its receipt, with no file I/O.

    `model` is a `transformers` causal LM, or any callable with `.vocab` mapping token ids
    (batch, length) to next-token logits (batch, vocab). `vocab` caps the token ids used
    (default: the model's vocabulary size); give the tokenizer's size when the embedding
    matrix is padded. Each axis draws from its own stream of `seed`, so adding an axis never
    changes another's examples."""
    if n_examples < 2:
        raise HarnessError(f"n_examples must be at least 2; got {n_examples}")
    lm = _NextToken(model, vocab, batch_size)
    was_training = bool(getattr(model, "training", False))
    if hasattr(model, "eval"):
        model.eval()
    try:
        with lm.torch.inference_mode():
            tasks = [
                fn(lm, np.random.default_rng([seed, i]), n_examples)
                for i, fn in enumerate(_AXES.values())
            ]
    finally:
        if was_training:
            model.train()
    meta = {"suite_version": SUITE_VERSION, "vocab": lm.vocab, **(metadata or {})}
    return EvalReport(checkpoint_id, tasks, seed, meta)
