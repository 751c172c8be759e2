"""One benchmark prompt: its conversation so far, its category, and the turns still to come. The
shipped set (:mod:`specchat.bench.prompts`) and the field's question files
(:mod:`specchat.bench.question_file`) both make them."""

from __future__ import annotations

from dataclasses import dataclass, replace

Message = dict[str, str]


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    id: str
    category: str
    messages: tuple[Message, ...]
    quick: bool = False
    follow_ups: tuple[str, ...] = ()
    """User turns still to come, each asked after the method's own answer to the one before, as
    Spec-Bench and MT-Bench run their multi-turn questions (see :meth:`next_turn`)."""
    turn: int = 1
    """Which user turn of its question this prompt ends with (1: the first)."""

    def next_turn(self, answer: str) -> BenchPrompt | None:
        """The question's next turn after ``answer`` (this turn's reply), or None after the last.

        The conversation so far, the reply and the next user turn: the second turn of a
        multi-turn question follows whatever the method answered first, so at T > 0 each
        method is asked its own follow-up, as in Spec-Bench. Its id is the question's with
        ``/t2``, ``/t3``… appended, so every turn is a prompt of its own in the records.
        """
        if not self.follow_ups:
            return None
        question = self.id.rsplit("/t", 1)[0] if self.turn > 1 else self.id
        messages = (
            *self.messages,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": self.follow_ups[0]},
        )
        return replace(
            self,
            id=f"{question}/t{self.turn + 1}",
            messages=messages,
            follow_ups=self.follow_ups[1:],
            turn=self.turn + 1,
        )
