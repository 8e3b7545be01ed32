"""Synthetic traffic for a workload preset: which requests arrive at each step.

Prompts are built from shared pieces the way real traffic shares them: one long
system prompt under many chat turns (each turn resends the conversation so far,
the previous answer included), few-shot examples reused across queries of a
task, popular documents pulled into many RAG prompts, and ShareGPT-like
independent prompts with heavy-tailed lengths and the odd verbatim resend.
Everything is drawn from one seeded RNG, so a preset always yields the same
traffic for the same answers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from harness.capture.presets import ChatSpec, FewShotSpec, Preset, RagSpec, ShareGPTSpec


@dataclass(frozen=True, slots=True)
class NewRequest:
    req_id: str
    prompt: list[int]
    max_tokens: int
    lora: tuple[str, int] | None = None  # (name, int_id)
    cache_salt: str | None = None


@dataclass(slots=True)
class _Conversation:
    system: list[int]
    turns_left: int
    lora: tuple[str, int] | None
    salt: str | None
    history: list[int] | None = None
    awaiting: str | None = None  # the request id of the turn in flight


@dataclass(slots=True)
class SyntheticWorkload:
    preset: Preset
    rng: random.Random = field(init=False)
    num_issued: int = 0
    # Pieces shared between requests (system prompts, examples, documents).
    pieces: dict = field(default_factory=dict)
    conversations: list[_Conversation] = field(default_factory=list)
    by_request: dict[str, _Conversation] = field(default_factory=dict)
    history: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.preset.seed)
        s = self.preset.shape
        if isinstance(s, ChatSpec):
            self.pieces["system"] = [self._tokens(s.system_prompt_tokens.draw(self.rng))
                                     for _ in range(s.num_system_prompts)]
        elif isinstance(s, FewShotSpec):
            self.pieces["tasks"] = [
                (self._tokens(s.instruction_tokens.draw(self.rng)),
                 [self._tokens(s.example_tokens.draw(self.rng))
                  for _ in range(s.examples_per_task)])
                for _ in range(s.tasks)]
        elif isinstance(s, RagSpec):
            self.pieces["system"] = self._tokens(s.system_prompt_tokens.draw(self.rng))
            self.pieces["docs"] = [self._tokens(s.document_tokens.draw(self.rng))
                                   for _ in range(s.documents)]
            self.pieces["weights"] = [1.0 / (i + 1) ** s.popularity for i in range(s.documents)]
        elif isinstance(s, ShareGPTSpec):
            self.pieces["system"] = self._tokens(s.system_prompt_tokens.draw(self.rng))

    @property
    def exhausted(self) -> bool:
        return self.num_issued >= self.preset.requests.count

    def _tokens(self, n: int) -> list[int]:
        v = self.preset.requests.vocab
        r = self.rng.randrange
        return [r(v) for _ in range(n)]

    def _limit(self, max_tokens: int) -> int:
        """The longest prompt that can ever be scheduled with its output."""
        e = self.preset.engine
        room = min(e.max_model_len, (e.num_blocks - 2) * e.block_size)
        return max(1, room - max_tokens)

    def _pick(self, choice) -> str | None:
        if choice.values and self.rng.random() < choice.fraction:
            return self.rng.choice(choice.values)
        return None

    def _lora(self) -> tuple[str, int] | None:
        name = self._pick(self.preset.requests.lora)
        return None if name is None else (name, self.preset.requests.lora.values.index(name) + 1)

    def _new(self, prompt: list[int], max_tokens: int, lora=None, salt=None) -> NewRequest:
        req = NewRequest(f"r{self.num_issued}", prompt[: self._limit(max_tokens)], max_tokens,
                         lora, salt)
        self.num_issued += 1
        return req

    def arrivals(self) -> list[NewRequest]:
        out = []
        for _ in range(self.preset.requests.arrivals_per_step.draw(self.rng)):
            if self.exhausted:
                break
            req = self._next()
            if req is None:
                break
            out.append(req)
        return out

    def finished(self, req_id: str, tokens: list[int]) -> None:
        """A request ended (its answer is in `tokens`, prompt included)."""
        conv = self.by_request.pop(req_id, None)
        if conv is not None:
            conv.history = list(tokens)
            conv.awaiting = None
            conv.turns_left -= 1

    def _next(self) -> NewRequest | None:
        s = self.preset.shape
        max_tokens = self.preset.requests.output_tokens.draw(self.rng)
        if isinstance(s, ChatSpec):
            return self._chat_turn(s, max_tokens)
        if isinstance(s, FewShotSpec):
            instruction, examples = self.rng.choice(self.pieces["tasks"])
            k = min(s.shots.draw(self.rng), len(examples))
            prompt = list(instruction)
            for ex in examples[:k]:
                prompt += ex
            prompt += self._tokens(s.query_tokens.draw(self.rng))
            return self._new_with_extras(prompt, max_tokens)
        if isinstance(s, RagSpec):
            docs, weights = self.pieces["docs"], self.pieces["weights"]
            k = min(s.docs_per_request.draw(self.rng), len(docs))
            chosen: set[int] = set()
            while len(chosen) < k:
                chosen.add(self.rng.choices(range(len(docs)), weights)[0])
            prompt = list(self.pieces["system"])
            for i in sorted(chosen):  # retrieval order: most popular first
                prompt += docs[i]
            prompt += self._tokens(s.question_tokens.draw(self.rng))
            return self._new_with_extras(prompt, max_tokens)
        assert isinstance(s, ShareGPTSpec)
        if self.history and self.rng.random() < s.repeat_fraction:
            prompt = list(self.rng.choice(self.history))
        else:
            prompt = list(self.pieces["system"]) if self.rng.random() < s.system_prompt_fraction \
                else []
            prompt += self._tokens(s.input_tokens.draw(self.rng))
            self.history.append(prompt)
            if len(self.history) > 256:
                self.history.pop(0)
        return self._new_with_extras(prompt, max_tokens)

    def _new_with_extras(self, prompt: list[int], max_tokens: int) -> NewRequest:
        """A request with the preset's chance of a LoRA adapter and a salt."""
        return self._new(prompt, max_tokens, self._lora(), self._pick(self.preset.requests.salts))

    def _chat_turn(self, s: ChatSpec, max_tokens: int) -> NewRequest | None:
        idle = [c for c in self.conversations if c.awaiting is None and c.turns_left > 0]
        if idle:
            conv = self.rng.choice(idle)
        elif len([c for c in self.conversations if c.turns_left > 0]) < s.conversations:
            conv = _Conversation(self.rng.choice(self.pieces["system"]), s.turns.draw(self.rng),
                                 self._lora(), self._pick(self.preset.requests.salts))
            self.conversations.append(conv)
        else:
            return None  # every open conversation waits for its answer
        self.conversations = [c for c in self.conversations if c.turns_left > 0]
        base = conv.history if conv.history is not None else conv.system
        prompt = base + self._tokens(s.user_tokens.draw(self.rng))
        if len(prompt) > self._limit(max_tokens):
            # Too long to continue: the user starts over with a fresh conversation.
            prompt = conv.system + self._tokens(s.user_tokens.draw(self.rng))
        req = self._new(prompt, max_tokens, conv.lora, conv.salt)
        conv.awaiting = req.req_id
        self.by_request[req.req_id] = conv
        return req
