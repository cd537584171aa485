"""The Figure-1 trace as a reader sees it: every kind marked in the mode used, word pieces joined
as the output text is, and no lines past the first EOS."""
import pytest
from rich.console import Console

from specjax.app import trace
from specjax.data.user_vocab import BUNDLED, resolve_vocabulary

PIECES = ["<pad>", "</s>", "▁you", "▁to", "▁use", "▁easily", "▁en", "um", "er", "ate", "▁",
          "s", "."]


class PieceVocab:
  """SentencePiece's decoding rule on a few pieces: '▁' is a space, the text's first space is
  dropped, decoding stops at EOS."""
  eos_id = 1

  def decode(self, ids):
    out = []
    for i in ids:
      if i == self.eos_id:
        break
      out.append(PIECES[i])
    return "".join(out).replace("▁", " ").lstrip(" ")


ID = {p: i for i, p in enumerate(PIECES)}
ROUNDS = [  # as trace_rounds returns them, ids
    {"gamma": 4, "accepted": [ID["▁you"], ID["▁to"]], "rejected": ID["▁use"],
     "correction": ID["▁easily"]},
    {"gamma": 4, "accepted": [ID["▁en"], ID["um"], ID["er"], ID["ate"]], "rejected": None,
     "correction": ID["▁"]},
    {"gamma": 4, "accepted": [ID["▁to"], ID["▁"]], "rejected": ID["s"], "correction": ID["."]},
    {"gamma": 4, "accepted": [], "rejected": ID["▁to"], "correction": ID["</s>"]},
    {"gamma": 4, "accepted": [ID["</s>"]], "rejected": None, "correction": ID["</s>"]},
]


def test_plain_trace_marks_all_three_kinds_joins_word_pieces_and_stops_at_eos():
  shown = trace.readable_rounds(ROUNDS, PieceVocab())
  assert trace.plain_trace(shown).splitlines() == [
      "[+you to+] [-use-] [*easily*]",   # the line's first space dropped; words' spaces kept
      "[+enumerate+][*␣*]",             # sub-words joined; a space piece visible
      "[+to␣+][-s-][*.*]",           # a space that ends the accepted run: visible
      "[-to-][*</s>*]",                 # the first EOS: the last line (EOS ignored or not)
  ]
  # the text the trace reads is the output's: accepted guesses and corrections, in order
  emitted = "".join("".join(r["accepted"]) + (r["correction"] or "") for r in shown)
  assert emitted == "you to easily enumerate  to .</s>"


def test_the_header_says_what_the_markers_are_in_the_mode_used():
  plain, colours = trace.legend(colours=False), trace.legend(colours=True)
  assert "[+x+] accepted" in plain and "[-x-] rejected" in plain
  assert "[*x*] the target's correction" in plain and "␣ a space" in plain
  assert "green" not in plain and "green accepted" in colours and "[+" not in colours


def test_colours_mark_each_kind_with_its_style():
  console = Console(record=True, force_terminal=True, width=80, color_system="truecolor")
  trace.print_trace(console, trace.readable_rounds(ROUNDS[:1], PieceVocab()), colours=True)
  text = console.export_text()
  assert text.splitlines()[0] == "you to use easily"
  spans = {str(s.style) for s in trace.render_trace(trace.readable_rounds(ROUNDS[:1],
                                                                          PieceVocab())).spans}
  assert spans == {"green", "red strike", "bold blue"}


@pytest.mark.parametrize("text", ["This package enumerates the files.", "Hallo Welt, wie geht's?"])
def test_pieces_of_the_bundled_vocabulary_join_into_the_decoded_text(text):
  vocab = resolve_vocabulary(BUNDLED)
  ids = vocab.encode(text)
  rounds = [{"gamma": 2, "accepted": ids[i:i + 2], "rejected": None,
             "correction": ids[i + 2] if i + 2 < len(ids) else None}
            for i in range(0, len(ids), 3)]
  shown = trace.readable_rounds(rounds, vocab)
  joined = "".join("".join(r["accepted"]) + (r["correction"] or "") for r in shown)
  assert joined == vocab.decode(ids)
