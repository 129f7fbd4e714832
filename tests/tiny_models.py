"""Tiny, locally built encoder checkpoints for offline tests.

Everything here is built from scratch on the local machine: a small multilingual
corpus (written below, plus combinatorially generated sentences) is used to train
tokenizers with the ``tokenizers`` library, and randomly initialised (seeded) tiny
models are saved next to them.  Nothing ever touches the Hugging Face Hub.

Public helpers:

* :func:`train_tokenizer` -- train and save a tokenizer for one model family.
* :func:`build_tiny_model` -- tiny ``bert`` / ``xlm-roberta`` / ``deberta-v2`` /
  ``modernbert`` checkpoint (config + safetensors + tokenizer).
* :func:`build_remote_code_model` -- a ``trust_remote_code`` checkpoint whose
  configuration and modelling code live in the checkpoint directory.
* :func:`build_all` -- all of the above under one root directory.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from tokenizers import (  # noqa: E402
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    BertConfig,
    DebertaV2Config,
    ModernBertConfig,
    PreTrainedTokenizerFast,
    XLMRobertaConfig,
)

__all__ = [
    "KINDS",
    "MAX_LENGTH",
    "REMOTE_KIND",
    "build_all",
    "build_remote_code_model",
    "build_tiny_model",
    "corpus",
    "train_tokenizer",
]

#: Model kinds supported by :func:`build_tiny_model`.
KINDS: tuple[str, ...] = ("bert", "xlm-roberta", "deberta-v2", "modernbert")
#: Key used by :func:`build_all` for the ``trust_remote_code`` checkpoint.
REMOTE_KIND = "tinyenc"
#: ``model_max_length`` of every tokenizer (and max positions of every model).
MAX_LENGTH = 128
VOCAB_SIZE = 1000

HIDDEN = 32
LAYERS = 2
HEADS = 2
INTERMEDIATE = 64

# --------------------------------------------------------------------------- corpus

_SENTENCES: tuple[str, ...] = (
    # English
    "The quick brown fox jumps over the lazy dog.",
    "I really enjoyed this movie, the acting was wonderful!",
    "The service at the restaurant was slow and the food was cold.",
    "Can you tell me where the nearest train station is?",
    "Scientists discovered a new species of frog in the rainforest.",
    "My sister bought a red bicycle last summer.",
    "This product broke after two days; I want a refund.",
    "The weather today is sunny with a light breeze.",
    "He doesn't think the meeting will start on time.",
    "Reading books before bed helps me relax.",
    "The stock market fell sharply on Monday morning.",
    "Our team won the championship after a long season.",
    "Please send the report by Friday at 5 pm.",
    "She plays the piano beautifully, doesn't she?",
    "A man is walking his dog in the park.",
    # German
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Ich habe den Film sehr genossen, die Schauspieler waren großartig!",
    "Das Essen im Restaurant war kalt und der Service war langsam.",
    "Können Sie mir sagen, wo der nächste Bahnhof ist?",
    "Wissenschaftler haben eine neue Froschart im Regenwald entdeckt.",
    "Meine Schwester hat letzten Sommer ein rotes Fahrrad gekauft.",
    "Dieses Produkt ist nach zwei Tagen kaputt gegangen.",
    "Das Wetter ist heute sonnig und etwas windig.",
    "Er glaubt nicht, dass die Besprechung pünktlich beginnt.",
    "Vor dem Schlafen lese ich gerne ein Buch.",
    "Die Börse ist am Montagmorgen stark gefallen.",
    "Unsere Mannschaft hat nach einer langen Saison gewonnen.",
    "Bitte schicken Sie den Bericht bis Freitag.",
    "Sie spielt wunderschön Klavier, nicht wahr?",
    "Ein Mann geht mit seinem Hund im Park spazieren.",
    # French
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "J'ai beaucoup aimé ce film, les acteurs étaient formidables !",
    "Le service au restaurant était lent et la nourriture froide.",
    "Pouvez-vous me dire où se trouve la gare la plus proche ?",
    "Des scientifiques ont découvert une nouvelle espèce de grenouille.",
    "Ma sœur a acheté un vélo rouge l'été dernier.",
    "Ce produit s'est cassé après deux jours ; je veux être remboursé.",
    "Il fait beau aujourd'hui avec une légère brise.",
    "Il ne pense pas que la réunion commencera à l'heure.",
    "Lire avant de dormir m'aide à me détendre.",
    "La bourse a fortement chuté lundi matin.",
    "Notre équipe a gagné le championnat après une longue saison.",
    "Merci d'envoyer le rapport avant vendredi.",
    "Elle joue magnifiquement du piano, n'est-ce pas ?",
    "Un homme promène son chien dans le parc.",
    # Spanish
    "El rápido zorro marrón salta sobre el perro perezoso.",
    "¡Me encantó esta película, la actuación fue maravillosa!",
    "El servicio del restaurante fue lento y la comida estaba fría.",
    "¿Puede decirme dónde está la estación de tren más cercana?",
    "Los científicos descubrieron una nueva especie de rana en la selva.",
    "Mi hermana compró una bicicleta roja el verano pasado.",
    "Este producto se rompió después de dos días; quiero un reembolso.",
    "Hoy hace sol y sopla una brisa ligera.",
    "Él no cree que la reunión empiece a tiempo.",
    "Leer antes de dormir me ayuda a relajarme.",
    "La bolsa cayó bruscamente el lunes por la mañana.",
    "Nuestro equipo ganó el campeonato después de una larga temporada.",
    "Por favor, envíe el informe antes del viernes.",
    "Ella toca el piano maravillosamente, ¿verdad?",
    "Un hombre pasea a su perro en el parque.",
)

# language -> (subjects, verbs, objects, adverbials, adjectives)
_LEXICON: dict[str, tuple[tuple[str, ...], ...]] = {
    "en": (
        ("The teacher", "My neighbour", "A child", "The doctor", "Our manager", "The cat"),
        ("likes", "hates", "repairs", "describes", "buys", "forgets"),
        ("the old car", "a new phone", "the blue house", "this recipe", "the contract"),
        ("every day", "on Sunday", "without hesitation", "in the evening", "again"),
        ("excellent", "terrible", "boring", "surprising", "expensive"),
    ),
    "de": (
        ("Der Lehrer", "Mein Nachbar", "Ein Kind", "Die Ärztin", "Unser Chef", "Die Katze"),
        ("mag", "hasst", "repariert", "beschreibt", "kauft", "vergisst"),
        ("das alte Auto", "ein neues Handy", "das blaue Haus", "dieses Rezept"),
        ("jeden Tag", "am Sonntag", "ohne Zögern", "am Abend", "schon wieder"),
        ("ausgezeichnet", "schrecklich", "langweilig", "überraschend", "teuer"),
    ),
    "fr": (
        ("Le professeur", "Mon voisin", "Un enfant", "La médecin", "Notre directeur", "Le chat"),
        ("aime", "déteste", "répare", "décrit", "achète", "oublie"),
        ("la vieille voiture", "un nouveau téléphone", "la maison bleue", "cette recette"),
        ("chaque jour", "le dimanche", "sans hésiter", "le soir", "encore une fois"),
        ("excellent", "terrible", "ennuyeux", "surprenant", "cher"),
    ),
    "es": (
        ("El profesor", "Mi vecino", "Un niño", "La doctora", "Nuestro jefe", "El gato"),
        ("quiere", "odia", "repara", "describe", "compra", "olvida"),
        ("el coche viejo", "un teléfono nuevo", "la casa azul", "esta receta"),
        ("todos los días", "el domingo", "sin dudar", "por la tarde", "otra vez"),
        ("excelente", "terrible", "aburrido", "sorprendente", "caro"),
    ),
}

_COPULA = {"en": "is", "de": "ist", "fr": "est", "es": "es"}
_THIS = {"en": "This", "de": "Das", "fr": "Ceci", "es": "Esto"}


def corpus(n_generated: int = 600, seed: int = 0) -> list[str]:
    """Return the hand-written sentences plus ``n_generated`` synthetic ones.

    Generated sentences combine a per-language lexicon with a seeded RNG, so the
    corpus (and therefore every trained tokenizer) is fully deterministic.
    """
    rng = random.Random(seed)
    langs = sorted(_LEXICON)
    out = list(_SENTENCES)
    for i in range(n_generated):
        lang = langs[i % len(langs)]
        subjects, verbs, objects, adverbials, adjectives = _LEXICON[lang]
        if rng.random() < 0.7:
            sent = f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(adverbials)}."
        else:
            sent = (
                f"{_THIS[lang]} {_COPULA[lang]} {rng.choice(adjectives)}, {rng.choice(adverbials)}!"
            )
        if rng.random() < 0.2:
            sent = f"{sent} {rng.randint(1, 2025)}"
        out.append(sent)
    return out


def byte_level_bpe(specials: list[str], texts) -> Tokenizer:
    """A byte-level BPE tokenizer (NFC, no prefix space) trained on `texts`, the special
    tokens first: the model of RoBERTa-, ModernBERT- and decoder-style vocabularies."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


# --------------------------------------------------------------------------- tokenizers

# kind -> tokenizer family.  The families mirror the real checkpoints:
#   bert        WordPiece, [CLS] A [SEP] B [SEP], token_type_ids
#   xlm-roberta Unigram (sentencepiece-like), <s> A </s></s> B </s>, no token_type_ids,
#               ids <s>=0 <pad>=1 </s>=2 <unk>=3 like the real XLM-R vocab
#   deberta-v2  Unigram, [CLS] A [SEP] B [SEP], token_type_ids (like DeBERTa-v3)
#   modernbert  byte-level BPE, [CLS] A [SEP] B [SEP], no token_type_ids
#   tinyenc     byte-level BPE, <s> A </s></s> B </s> (roberta-like), no token_type_ids
_BERT_SPECIALS = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
}
_ROBERTA_SPECIALS = {
    "bos_token": "<s>",
    "pad_token": "<pad>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "cls_token": "<s>",
    "sep_token": "</s>",
    "mask_token": "<mask>",
}
_TOKENIZER_KINDS = (*KINDS, REMOTE_KIND)


def _ordered_specials(specials: dict[str, str], order: tuple[str, ...]) -> list[str]:
    assert set(order) == set(specials.values())
    return list(order)


def _bert_template(cls: str, sep: str, tok: Tokenizer) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, tok.token_to_id(cls)), (sep, tok.token_to_id(sep))],
    )


def _roberta_template(tok: Tokenizer) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:0",
        pair="<s>:0 $A:0 </s>:0 </s>:0 $B:0 </s>:0",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
    )


def _bert_normalizer() -> normalizers.BertNormalizer:
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False
    )


def _wordpiece_alphabet(tok: Tokenizer, texts: list[str], exclude: list[str]) -> list[str]:
    """Sorted word-initial characters, then sorted ``##``-prefixed inner characters."""
    initial: set[str] = set()
    inner: set[str] = set()
    for text in texts:
        normalized = tok.normalizer.normalize_str(text)
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(normalized):
            initial.add(word[0])
            inner.update(f"##{c}" for c in word[1:])
    return [t for t in sorted(initial) + sorted(inner) if t not in exclude]


def _canonicalize_unigram(tok: Tokenizer, n_specials: int, unk_id: int) -> None:
    """Make a trained Unigram model byte-identical across processes.

    Two things vary between runs of the Unigram trainer (hash-set iteration order):
    the EM scores differ in the last ulp, and the characters the model did not keep
    are re-added with scores ``min_score + k * 1e-4`` (k = 0, 1, ...) handed out in
    iteration order.  Round the scores, give those characters their scores in
    sorted order, and order all pieces by (score, piece).
    """
    pieces = json.loads(tok.to_str())["model"]["vocab"]
    specials = [(p, 0.0) for p, _ in pieces[:n_specials]]
    learned = [(p, round(s, 6)) for p, s in pieces[n_specials:]]
    min_score = min(s for _, s in learned)
    penalised: list[int] = []
    for k in range(len(learned)):
        target = min_score + k * 1e-4
        hits = [i for i, (p, s) in enumerate(learned) if len(p) == 1 and abs(s - target) < 1e-6]
        if not hits:
            break
        penalised.extend(hits)
    chars = sorted(learned[i][0] for i in penalised)
    scores = sorted((learned[i][1] for i in penalised), reverse=True)
    for i, char, score in zip(sorted(penalised), chars, scores, strict=True):
        learned[i] = (char, score)
    rest = sorted(learned, key=lambda x: (-x[1], x[0]))
    tok.model = models.Unigram(specials + rest, unk_id=unk_id, byte_fallback=False)


def _raw_tokenizer(kind: str, texts: list[str]) -> tuple[Tokenizer, dict[str, str], list[str]]:
    """Train a ``tokenizers.Tokenizer``; return it with its special tokens and input names."""
    if kind == "bert":
        specials = dict(_BERT_SPECIALS)
        order = _ordered_specials(specials, ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"))
        # The WordPiece trainer numbers "##x" pieces in Rust hash-map order, which
        # changes the merges from one process to the next.  Passing the alphabet as
        # (temporary) special tokens pins its ids, so training is reproducible; the
        # trained vocab is then loaded into a fresh tokenizer with the real specials.
        scratch = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        scratch.normalizer = _bert_normalizer()
        scratch.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        alphabet = _wordpiece_alphabet(scratch, texts, exclude=order)
        trainer = trainers.WordPieceTrainer(
            vocab_size=VOCAB_SIZE,
            min_frequency=1,
            special_tokens=order + alphabet,
            show_progress=False,
        )
        scratch.train_from_iterator(texts, trainer=trainer)
        tok = Tokenizer(
            models.WordPiece(
                vocab=scratch.get_vocab(with_added_tokens=True),
                unk_token="[UNK]",
                continuing_subword_prefix="##",
                max_input_chars_per_word=100,
            )
        )
        tok.normalizer = _bert_normalizer()
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.add_special_tokens(order)
        tok.decoder = decoders.WordPiece(prefix="##")
        tok.post_processor = _bert_template("[CLS]", "[SEP]", tok)
        return tok, specials, ["input_ids", "token_type_ids", "attention_mask"]

    if kind in ("xlm-roberta", "deberta-v2"):
        if kind == "xlm-roberta":
            specials = dict(_ROBERTA_SPECIALS)
            order = _ordered_specials(specials, ("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
            unk = "<unk>"
        else:
            specials = dict(_BERT_SPECIALS, bos_token="[CLS]", eos_token="[SEP]")
            order = _ordered_specials(specials, ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"))
            unk = "[UNK]"
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence(
            [normalizers.NFKC(), normalizers.Replace(" {2,}", " ")]
        )
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=order,
            unk_token=unk,
            shrinking_factor=0.75,
            max_piece_length=16,
            n_sub_iterations=2,
            show_progress=False,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        _canonicalize_unigram(tok, n_specials=len(order), unk_id=order.index(unk))
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        if kind == "xlm-roberta":
            tok.post_processor = _roberta_template(tok)
            names = ["input_ids", "attention_mask"]
        else:
            tok.post_processor = _bert_template("[CLS]", "[SEP]", tok)
            names = ["input_ids", "token_type_ids", "attention_mask"]
        return tok, specials, names

    if kind in ("modernbert", REMOTE_KIND):
        if kind == "modernbert":
            specials = dict(_BERT_SPECIALS)
            order = _ordered_specials(specials, ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"))
        else:
            specials = dict(_ROBERTA_SPECIALS)
            order = _ordered_specials(specials, ("<s>", "<pad>", "</s>", "<unk>", "<mask>"))
        tok = byte_level_bpe(order, texts)
        tok.decoder = decoders.ByteLevel()
        if kind == "modernbert":
            tok.post_processor = _bert_template("[CLS]", "[SEP]", tok)
        else:
            tok.post_processor = _roberta_template(tok)
        return tok, specials, ["input_ids", "attention_mask"]

    raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {_TOKENIZER_KINDS}")


def train_tokenizer(out_dir: Path, kind: str) -> PreTrainedTokenizerFast:
    """Train a ~1000-token tokenizer for ``kind`` and ``save_pretrained`` it to ``out_dir``.

    ``kind`` is one of :data:`KINDS` or ``"tinyenc"``.  The result reloads with
    ``AutoTokenizer.from_pretrained(out_dir)`` (as a ``PreTrainedTokenizerFast``),
    adds the family's special tokens for single sentences and pairs, and returns
    ``token_type_ids`` only for the families whose real tokenizers do (bert,
    deberta-v2).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok, specials, input_names = _raw_tokenizer(kind, corpus())
    # <mask> / [MASK] swallow the space before them, as in the real tokenizers.
    specials_kw: dict[str, str | AddedToken] = dict(specials)
    specials_kw["mask_token"] = AddedToken(specials["mask_token"], lstrip=True, special=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=MAX_LENGTH,
        padding_side="right",
        truncation_side="right",
        model_input_names=input_names,
        clean_up_tokenization_spaces=False,
        **specials_kw,
    )
    fast.save_pretrained(out_dir)
    return fast


# --------------------------------------------------------------------------- models


def _config_for(kind: str, tok: PreTrainedTokenizerFast, num_labels: int):
    common = {
        "vocab_size": len(tok),
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "num_labels": num_labels,
        "pad_token_id": tok.pad_token_id,
    }
    if kind == "bert":
        return BertConfig(
            **common,
            max_position_embeddings=MAX_LENGTH,
            type_vocab_size=2,
        )
    if kind == "xlm-roberta":
        # Positions are numbered from padding_idx + 1 (= 2), so a 128-token input
        # needs 128 + pad_token_id + 1 = 130 position embeddings.
        return XLMRobertaConfig(
            **common,
            max_position_embeddings=MAX_LENGTH + tok.pad_token_id + 1,
            type_vocab_size=1,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
    if kind == "deberta-v2":
        # DeBERTa-v3 style: relative attention with log buckets, no absolute
        # positions, no token type embeddings.
        return DebertaV2Config(
            **common,
            max_position_embeddings=MAX_LENGTH,
            type_vocab_size=0,
            relative_attention=True,
            max_relative_positions=-1,
            position_buckets=32,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            norm_rel_ebd="layer_norm",
            share_att_key=True,
            layer_norm_eps=1e-7,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
    if kind == "modernbert":
        # Defaults point pad/bos/eos/cls/sep at ids around 50281, far outside a tiny
        # vocab: they must be the tokenizer's ids.  Layer 0 is global, layer 1 local.
        return ModernBertConfig(
            **common,
            max_position_embeddings=MAX_LENGTH,
            bos_token_id=tok.cls_token_id,
            eos_token_id=tok.sep_token_id,
            cls_token_id=tok.cls_token_id,
            sep_token_id=tok.sep_token_id,
            global_attn_every_n_layers=2,
            local_attention=16,
            classifier_pooling="cls",
            reference_compile=False,
        )
    raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS}")


def build_tiny_model(kind: str, out_dir: Path, num_labels: int | None = 2) -> Path:
    """Build a tiny randomly initialised (seed 0) checkpoint of ``kind`` in ``out_dir``.

    Saves ``config.json``, ``model.safetensors`` and the tokenizer.  With the
    default, the checkpoint is an ``...ForSequenceClassification`` with a
    ``num_labels``-way head; loading it with a different ``num_labels`` then needs
    ``ignore_mismatched_sizes=True``.  ``num_labels=None`` saves the bare encoder
    (``AutoModel``) instead, like a pretrained Hub checkpoint, so any
    ``num_labels`` loads with a freshly initialised head.
    """
    out_dir = Path(out_dir)
    tok = train_tokenizer(out_dir, kind)
    config = _config_for(kind, tok, num_labels if num_labels is not None else 2)
    torch.manual_seed(0)
    if num_labels is None:
        model = AutoModel.from_config(config)
    else:
        model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


# --------------------------------------------------------------------------- remote code

_CONFIGURATION_TINYENC = '''\
"""Configuration of the tiny remote-code encoder used in tests."""

from transformers import PretrainedConfig


class TinyEncConfig(PretrainedConfig):
    model_type = "tinyenc"

    def __init__(
        self,
        vocab_size=1000,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.1,
        classifier_dropout=None,
        initializer_range=0.02,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_dropout_prob = hidden_dropout_prob
        self.classifier_dropout = classifier_dropout
        self.initializer_range = initializer_range
        self.layer_norm_eps = layer_norm_eps
        super().__init__(
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            **kwargs,
        )
'''

_MODELING_TINYENC = '''\
"""A tiny bidirectional transformer encoder loaded through trust_remote_code."""

from typing import Optional

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, SequenceClassifierOutput

from .configuration_tinyenc import TinyEncConfig


class TinyEncPreTrainedModel(PreTrainedModel):
    config_class = TinyEncConfig
    base_model_prefix = "tinyenc"
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()


class TinyEncModel(TinyEncPreTrainedModel):
    def __init__(self, config: TinyEncConfig):
        super().__init__(config)
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.embed_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.embed_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.layers = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(
                    d_model=config.hidden_size,
                    nhead=config.num_attention_heads,
                    dim_feedforward=config.intermediate_size,
                    dropout=config.hidden_dropout_prob,
                    activation="gelu",
                    layer_norm_eps=config.layer_norm_eps,
                    batch_first=True,
                )
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embeddings

    def set_input_embeddings(self, value):
        self.word_embeddings = value

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ):
        output_hidden_states = (
            output_hidden_states
            if output_hidden_states is not None
            else self.config.output_hidden_states
        )
        return_dict = return_dict if return_dict is not None else self.config.use_return_dict
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Specify exactly one of input_ids or inputs_embeds")
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        batch, seq_len = inputs_embeds.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(seq_len, device=inputs_embeds.device).expand(batch, -1)
        hidden = self.embed_dropout(
            self.embed_norm(inputs_embeds + self.position_embeddings(position_ids))
        )
        padding_mask = None
        if attention_mask is not None:
            padding_mask = attention_mask.to(inputs_embeds.device) == 0
        all_hidden = (hidden,) if output_hidden_states else None
        for layer in self.layers:
            hidden = layer(hidden, src_key_padding_mask=padding_mask)
            if output_hidden_states:
                all_hidden = all_hidden + (hidden,)
        if not return_dict:
            return tuple(v for v in (hidden, all_hidden) if v is not None)
        return BaseModelOutput(last_hidden_state=hidden, hidden_states=all_hidden)


class TinyEncForSequenceClassification(TinyEncPreTrainedModel):
    def __init__(self, config: TinyEncConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.tinyenc = TinyEncModel(config)
        dropout = (
            config.classifier_dropout
            if config.classifier_dropout is not None
            else config.hidden_dropout_prob
        )
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: Optional[torch.LongTensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        token_type_ids: Optional[torch.Tensor] = None,
        position_ids: Optional[torch.LongTensor] = None,
        inputs_embeds: Optional[torch.Tensor] = None,
        labels: Optional[torch.Tensor] = None,
        output_hidden_states: Optional[bool] = None,
        return_dict: Optional[bool] = None,
        **kwargs,
    ):
        return_dict = return_dict if return_dict is not None else self.config.use_return_dict
        outputs = self.tinyenc(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        pooled = outputs.last_hidden_state[:, 0]
        pooled = torch.tanh(self.dense(self.dropout(pooled)))
        logits = self.classifier(self.dropout(pooled))

        loss = None
        if labels is not None:
            labels = labels.to(logits.device)
            if self.config.problem_type is None:
                if self.num_labels == 1:
                    self.config.problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    self.config.problem_type = "single_label_classification"
                else:
                    self.config.problem_type = "multi_label_classification"
            if self.config.problem_type == "regression":
                loss_fct = nn.MSELoss()
                if self.num_labels == 1:
                    loss = loss_fct(logits.squeeze(-1).float(), labels.squeeze(-1).float())
                else:
                    loss = loss_fct(logits.float(), labels.float())
            elif self.config.problem_type == "single_label_classification":
                loss = nn.CrossEntropyLoss()(
                    logits.view(-1, self.num_labels).float(), labels.view(-1)
                )
            else:
                loss = nn.BCEWithLogitsLoss()(logits.float(), labels.float())

        if not return_dict:
            output = (logits,) + tuple(outputs.values())[1:]
            return ((loss,) + output) if loss is not None else output
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states
        )
'''

_AUTO_MAP = {
    "AutoConfig": "configuration_tinyenc.TinyEncConfig",
    "AutoModel": "modeling_tinyenc.TinyEncModel",
    "AutoModelForSequenceClassification": "modeling_tinyenc.TinyEncForSequenceClassification",
}


def build_remote_code_model(out_dir: Path) -> Path:
    """Build a ``trust_remote_code`` checkpoint (model_type ``"tinyenc"``) in ``out_dir``.

    The directory holds ``configuration_tinyenc.py``, ``modeling_tinyenc.py``, a
    ``config.json`` whose ``auto_map`` covers ``AutoConfig``, ``AutoModel`` and
    ``AutoModelForSequenceClassification``, the bare encoder's weights (no
    classification head, so any ``num_labels`` loads), and a roberta-like
    tokenizer.  Loading it requires ``trust_remote_code=True``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(out_dir, REMOTE_KIND)
    (out_dir / "configuration_tinyenc.py").write_text(_CONFIGURATION_TINYENC, encoding="utf-8")
    (out_dir / "modeling_tinyenc.py").write_text(_MODELING_TINYENC, encoding="utf-8")
    config_json = {
        "model_type": REMOTE_KIND,
        "architectures": ["TinyEncModel"],
        "auto_map": dict(_AUTO_MAP),
        "vocab_size": len(tok),
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": MAX_LENGTH,
        "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
    }
    config_path = out_dir / "config.json"
    config_path.write_text(json.dumps(config_json, indent=2) + "\n", encoding="utf-8")

    # Instantiate through the dynamic-module machinery (as users will), save weights.
    config = AutoConfig.from_pretrained(out_dir, trust_remote_code=True)
    torch.manual_seed(0)
    model = AutoModel.from_config(config, trust_remote_code=True)
    model.save_pretrained(out_dir, safe_serialization=True)

    # save_pretrained rewrites config.json; make sure every auto_map entry survived.
    saved = json.loads(config_path.read_text(encoding="utf-8"))
    saved["auto_map"] = dict(_AUTO_MAP)
    config_path.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return out_dir


def build_all(root: Path, num_labels: int | None = 2) -> dict[str, Path]:
    """Build every kind under ``root``; return ``{kind: checkpoint_dir}``.

    Keys are :data:`KINDS` plus ``"tinyenc"`` (the remote-code model, always
    saved without a head).  ``num_labels`` is passed to :func:`build_tiny_model`.
    """
    root = Path(root)
    paths = {kind: build_tiny_model(kind, root / kind, num_labels=num_labels) for kind in KINDS}
    paths[REMOTE_KIND] = build_remote_code_model(root / REMOTE_KIND)
    return paths
