"""The 2-layer LSTM word language model (Zaremba et al.; PyTorch word_language_model).

Example::

    lm = LSTMLanguageModel(vocab_size=10000, embedding_dim=650, hidden_dim=650)
    logits, hidden = lm(tokens)                          # tokens: [bptt, batch]
    hidden = detach_hidden(hidden)                       # truncated BPTT
"""
from __future__ import annotations

import torch
from torch import nn

from .common import check_positive


Hidden = tuple[torch.Tensor, torch.Tensor]


class LSTMLanguageModel(nn.Module):
    """Word-level LSTM language model (Zaremba et al. 2014, PyTorch ``word_language_model``).

    Embedding -> dropout -> ``num_layers``-layer LSTM -> dropout -> Linear to the vocabulary.
    With ``tie_weights`` the decoder shares the embedding matrix (Press & Wolf 2016), which
    requires ``embedding_dim == hidden_dim``. The defaults are the "large" PTB setting.

    Shapes (sequence-first, as produced by ``gravac.data.get_bptt_batch``):

    * ``input``: int64 ``[seq_len, batch]`` token ids.
    * ``hidden``: ``(h, c)``, each ``[num_layers, batch, hidden_dim]`` (see ``init_hidden``).
    * returns ``(logits, hidden)``: logits ``[seq_len * batch, vocab_size]`` (flattened, so
      ``F.cross_entropy(logits, target)`` takes the flat target of ``get_bptt_batch``) and the
      new hidden state, same shapes as the input one.

    Example::

        model = LSTMLanguageModel(vocab_size=10000, embedding_dim=650, hidden_dim=650, dropout=0.5)
        hidden = model.init_hidden(batch_size=20)
        logits, hidden = model(tokens[:35], hidden)     # tokens: [steps, 20]
        hidden = detach_hidden(hidden)                  # truncate BPTT between batches
    """

    def __init__(self, vocab_size: int, embedding_dim: int = 1500, hidden_dim: int = 1500,
                 num_layers: int = 2, dropout: float = 0.65, tie_weights: bool = True):
        super().__init__()
        check_positive(vocab_size=vocab_size, embedding_dim=embedding_dim,
                        hidden_dim=hidden_dim, num_layers=num_layers)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"lstm: dropout must be in [0, 1), got {dropout}")
        if tie_weights and embedding_dim != hidden_dim:
            raise ValueError(f"lstm: tie_weights=True requires embedding_dim == hidden_dim, got "
                             f"embedding_dim={embedding_dim} and hidden_dim={hidden_dim}; make "
                             f"them equal or pass tie_weights=False")
        self.vocab_size = vocab_size
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, embedding_dim)
        # nn.LSTM's dropout acts between layers only; self.drop handles input and output.
        self.rnn = nn.LSTM(embedding_dim, hidden_dim, num_layers,
                           dropout=dropout if num_layers > 1 else 0.0)
        self.decoder = nn.Linear(hidden_dim, vocab_size)
        # Same initialisation as the PyTorch example: small uniform embeddings/decoder.
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        else:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def init_hidden(self, batch_size: int) -> Hidden:
        """Zero ``(h, c)``, each ``[num_layers, batch_size, hidden_dim]``, on the model's device.

        Example::

            hidden = model.init_hidden(20)
        """
        weight = self.decoder.bias
        shape = (self.num_layers, batch_size, self.hidden_dim)
        return (weight.new_zeros(shape), weight.new_zeros(shape))

    def forward(self, input: torch.Tensor, hidden: Hidden | None = None
                ) -> tuple[torch.Tensor, Hidden]:
        if input.dim() != 2:
            raise ValueError(f"lstm: input must be [seq_len, batch] token ids, got shape "
                             f"{tuple(input.shape)}")
        if hidden is None:
            hidden = self.init_hidden(input.shape[1])
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        logits = self.decoder(self.drop(output))
        return logits.view(-1, self.vocab_size), hidden


def lstm_paper(vocab_size: int, embedding_dim: int = 1500, hidden_dim: int = 1500,
               num_layers: int = 2, dropout: float = 0.65,
               tie_weights: bool = False) -> LSTMLanguageModel:
    """The GraVAC paper's LSTM: 2 layers of 1500 units, embedding 1500, dropout 0.65, the
    decoder *not* tied to the embedding (the authors' model). On Penn Treebank's 10,000
    words: 66,034,000 parameters, ~252 MiB in fp32, the size of the paper's Table 1.

    Example::

        model = lstm_paper(vocab_size=10000)
    """
    return LSTMLanguageModel(vocab_size, embedding_dim, hidden_dim, num_layers, dropout,
                             tie_weights)


def detach_hidden(hidden: Hidden) -> Hidden:
    """Cut the autograd history of an LSTM state (truncated BPTT between batches).

    Example::

        hidden = detach_hidden(hidden)
    """
    return tuple(h.detach() for h in hidden)  # type: ignore[return-value]
