"""Penn Treebank text: vocabulary, token tensors, rank shards and BPTT batches."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from .errors import DataFileError, check_root
from .samplers import check_rank


PTB_FILES = ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt")


@dataclass
class Dictionary:
    """Word <-> id mapping, ids in order of first appearance.

    Example::

        d = Dictionary(); d.add_word("the"); d.word2idx["the"], d.idx2word[0]   # 0, "the"
    """

    word2idx: dict[str, int] = field(default_factory=dict)
    idx2word: list[str] = field(default_factory=list)

    def add_word(self, word: str) -> int:
        """The id of ``word``, adding it if new."""
        idx = self.word2idx.get(word)
        if idx is None:
            idx = self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return idx

    def __len__(self) -> int:
        return len(self.idx2word)


@dataclass
class Corpus:
    """A tokenised corpus: ``dictionary`` and 1-D int64 token streams ``train/valid/test``.

    Example::

        corpus = load_ptb("/data/ptb"); len(corpus.dictionary)   # 10000
    """

    dictionary: Dictionary
    train: torch.Tensor
    valid: torch.Tensor
    test: torch.Tensor


def _read_words(path: str) -> list[str]:
    words: list[str] = []
    try:
        # utf-8-sig: a byte-order mark (some editors write one) is not part of a word
        with open(path, encoding="utf-8-sig") as f:
            for line in f:
                # One sentence per line; <eos> marks its end, as in pytorch/examples.
                words.extend(line.split())
                words.append("<eos>")
    except UnicodeDecodeError as exc:
        raise DataFileError(path, f"not UTF-8 text (byte {exc.start}: {exc.reason})",
                            "use the plain-text Mikolov PTB files") from None
    if not any(w != "<eos>" for w in words):
        raise DataFileError(path, "holds no words (empty)",
                            "copy the full Mikolov PTB file there")
    return words


def load_ptb(root: str | os.PathLike) -> Corpus:
    """Read the Mikolov Penn Treebank files ``ptb.{train,valid,test}.txt`` from ``root``.

    Each line is a sentence; "<eos>" is appended to each. The vocabulary is built from the
    training file (ids in order of first appearance); a valid/test word missing from it
    becomes "<unk>" (already a PTB word; added to the vocabulary if absent).

    Example::

        corpus = load_ptb("/data/ptb")
        train = batchify(corpus.train, batch_size=20)     # [46479, 20]
    """
    root = os.fspath(root)
    check_root(root, ", ".join(PTB_FILES))
    missing = [n for n in PTB_FILES if not os.path.isfile(os.path.join(root, n))]
    if missing:
        raise FileNotFoundError(
            f"ptb: missing {', '.join(missing)} in {root!r} (expected {', '.join(PTB_FILES)} "
            f"there). Get the Mikolov PTB files from the simple-examples tarball "
            f"(http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz, folder "
            f"simple-examples/data/) or from the data/penn/ folder of pytorch/examples "
            f"word_language_model (train.txt, valid.txt, test.txt: rename them to "
            f"ptb.train.txt, ptb.valid.txt, ptb.test.txt), and put them into {root!r}")
    dictionary = Dictionary()
    train_words = _read_words(os.path.join(root, PTB_FILES[0]))
    train = torch.tensor([dictionary.add_word(w) for w in train_words], dtype=torch.int64)

    def encode(name: str) -> torch.Tensor:
        ids = []
        for w in _read_words(os.path.join(root, name)):
            idx = dictionary.word2idx.get(w)
            ids.append(idx if idx is not None else dictionary.add_word("<unk>"))
        return torch.tensor(ids, dtype=torch.int64)

    return Corpus(dictionary, train, encode(PTB_FILES[1]), encode(PTB_FILES[2]))


def shard_tokens(tokens: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of a token stream split into ``world_size`` equal parts.

    Call before ``batchify`` so each rank trains on its own text; the last
    ``len(tokens) % world_size`` tokens are dropped so the shards have equal length.

    Example::

        train = batchify(shard_tokens(corpus.train, rank, world_size), batch_size=20)
    """
    check_rank(rank, world_size)
    size = tokens.numel() // world_size
    if size == 0:
        raise ValueError(f"shard_tokens: {tokens.numel()} tokens cannot be split across "
                         f"{world_size} ranks")
    return tokens[rank * size:(rank + 1) * size]


def batchify(tokens: torch.Tensor, batch_size: int) -> torch.Tensor:
    """Cut a 1-D token stream into ``batch_size`` columns: ``[steps, batch_size]``.

    Column ``j`` is the contiguous stretch ``tokens[j * steps:(j + 1) * steps]``; the
    trailing ``len % batch_size`` tokens are dropped (as in pytorch/examples).

    Example::

        batchify(torch.arange(10), 3)     # [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    """
    if tokens.dim() != 1:
        raise ValueError(f"batchify: expected a 1-D token stream, got shape {tuple(tokens.shape)}")
    if batch_size < 1:
        raise ValueError(f"batchify: batch_size must be >= 1, got {batch_size}")
    steps = tokens.numel() // batch_size
    if steps == 0:
        raise ValueError(f"batchify: {tokens.numel()} tokens are fewer than batch_size="
                         f"{batch_size}; use a smaller batch size")
    return tokens[:steps * batch_size].view(batch_size, steps).t().contiguous()


def get_bptt_batch(source: torch.Tensor, i: int, bptt: int = 35
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The truncated-BPTT window starting at row ``i`` of a batchified ``source``.

    Returns ``(input, target)``: input ``[seq_len, batch]`` = ``source[i:i+seq_len]`` and
    the flat target ``[seq_len * batch]`` = ``source[i+1:i+1+seq_len]``, i.e. the next
    token of each input position, with ``seq_len = min(bptt, len(source) - 1 - i)``.

    Example::

        for i in range(0, train.size(0) - 1, 35):
            x, y = get_bptt_batch(train, i)
            logits, hidden = model(x, hidden)
            loss = F.cross_entropy(logits, y)
    """
    if bptt < 1:
        raise ValueError(f"get_bptt_batch: bptt must be >= 1, got {bptt}")
    if not 0 <= i < len(source) - 1:
        raise ValueError(f"get_bptt_batch: i={i} out of range; a source of {len(source)} rows "
                         f"allows 0 <= i < {len(source) - 1}")
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)
