"""The gateway's engine side: chat requests from any thread, sampled by one DecodeEngine in the thread that
pumps it, each session's calls recorded as trajectories.

A session is one episode of an agent (or, when serving, one request). Its first call renders the messages and
starts a sample; a later call whose messages extend the previous call's messages and the reply the gateway gave
(the agent appended tool results or a user turn) feeds only the new messages' template text after the ids as
sampled, on the same KV cache: one trajectory, whose action mask covers the sampled tokens only. A call that does
not extend them (the agent edited its history, changed its tools) starts a new sample of the episode
(`prefix_breaks`). Every call is recorded: the ids it fed, the ids sampled, their log-probs, how the turn ended
(the policy version is the episode's, in the ledger row).
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import queue
import time
from typing import Callable, Dict, List, Optional

import numpy as np

from alignment.envs.chat import continuation_ids, prompt_text
from alignment.envs.formats import ToolCallFormat
from alignment.envs.multiturn import Trajectory
from alignment.gateway import completions, live, render
from alignment.gateway.outcome import Choice, Outcome
from alignment.gateway.protocol import ChatRequest, GatewayError
from alignment.models.engine import DecodeEngine, DecodeSequence
from alignment.models.multi_lora import adapter_routing
from alignment.models.sampling import GenerationConfig


@dataclasses.dataclass
class Session:
    """One episode's calls. rng: its sampler's random numbers (None: the engine's draw); budget: tokens a sample
    may hold after its first prompt; ephemeral: a serving request's (released after its reply)."""
    id: str
    rng: Optional[np.random.Generator] = None
    budget: Optional[int] = None
    ephemeral: bool = False
    seq: Optional[DecodeSequence] = None
    history: list = dataclasses.field(default_factory=list)  # the live sample's messages, the last reply included
    tools: tuple = ()
    shown: list = dataclasses.field(default_factory=list)  # the template's view of them
    close: str = ""  # the eos text that ended the last turn
    stops: tuple = ()
    samples: List[Trajectory] = dataclasses.field(default_factory=list)  # the live one last
    calls: List[dict] = dataclasses.field(default_factory=list)
    prefix_breaks: int = 0
    closed: bool = False
    waiting: list = dataclasses.field(default_factory=list)  # calls queued behind the one in flight

    @property
    def sample(self) -> Optional[Trajectory]:
        return self.samples[-1] if self.samples else None


@dataclasses.dataclass
class Call:
    session: Session
    request: ChatRequest
    future: cf.Future
    seqs: list = dataclasses.field(default_factory=list)  # its sequences (n choices when serving)
    choices: dict = dataclasses.field(default_factory=dict)  # id(sequence) -> (reply Message, its text)
    completion: bool = False  # a legacy completions call (completions.py), not a chat
    model: str = ""  # the served model it runs, as answers name it
    adapter: Optional[int] = None  # its LoRA adapter's index (multi_lora.py; None: the base)
    feed: object = None  # a streamed call's streaming.Feed (live.py)
    id: str = ""  # as its answer names it
    created: int = 0


class Gateway:
    """Chat completions over `model`. sampler(request) -> (GenerationConfig, log-prob temperature): the sampling of
    a call (a training run imposes its own); `fmt` parses tool calls and shows tools. A model with served LoRA
    adapters (multi_lora.load_adapters) answers serving requests under the base's name and each adapter's."""

    def __init__(self, model, tokenizer, slots: int, capacity: int, fmt: ToolCallFormat,
                 sampler: Callable[[ChatRequest], tuple], model_name: str = "policy", draft=None):
        self.engine = DecodeEngine(model, slots, capacity, draft=draft)  # draft: a DraftModel (speculative)
        self.tokenizer, self.fmt, self.sampler, self.model_name = tokenizer, fmt, sampler, model_name
        self.capacity, self.vocab_size = capacity, model.config.vocab_size
        self.inbox: "queue.Queue[Call]" = queue.Queue()
        self.cancels: "queue.Queue[Call]" = queue.Queue()  # streamed calls whose client went away
        self.sessions: Dict[str, Session] = {}
        self.backlog: List[Call] = []  # calls waiting for a free slot
        self.running: Dict[int, Call] = {}  # id(sequence) -> its call
        self.counter = 0
        self.adapters = adapter_routing(model)

    def model_names(self) -> List[str]:
        return [self.model_name] + (self.adapters.names if self.adapters is not None else [])

    def served_model(self, name: str):
        """(the name answers carry, the adapter index or None) of a serving request's `model`. With adapters
        served it must name the base or an adapter (none given: the base); a lone model answers to any name."""
        if self.adapters is None or name in ("", self.model_name):
            return self.model_name, None
        if name in self.adapters.names:
            return name, self.adapters.index(name)
        raise GatewayError(404, f"The model '{name}' does not exist; served here: {', '.join(self.model_names())}",
                           "model", "model_not_found")

    # ------------------------------------------------------------------ any thread

    def submit(self, session_id: Optional[str], request: ChatRequest, feed=None) -> cf.Future:
        """Queue a call (a new ephemeral session when session_id is None); the future gets its `Outcome` (each
        route writes it in its protocol) or a GatewayError. A streamed call's `feed` (streaming.Feed) gets its
        head as it starts, its deltas after each engine step, then the outcome or the error (live.py)."""
        future: cf.Future = cf.Future()
        call = Call(Session("") if session_id is None else session_id, request, future, feed=feed)
        if feed is not None:
            feed.call = call
            future.add_done_callback(feed.finish)
        self.inbox.put(call)
        return future

    def cancel(self, feed) -> None:
        """The client of a streamed call went away: its sequences leave the engine at the next step (live.py)."""
        self.cancels.put(feed.call)

    def submit_completion(self, request) -> cf.Future:
        """Queue a legacy completions call (completions.CompletionRequest)."""
        future: cf.Future = cf.Future()
        self.inbox.put(Call(None, request, future, completion=True))
        return future

    # ------------------------------------------------------------------ the pumping thread

    def open_session(self, session_id: str, rng=None, budget: Optional[int] = None) -> Session:
        self.sessions[session_id] = session = Session(session_id, rng, budget)
        return session

    def close_session(self, session: Session, why: str) -> None:
        """No more calls: the queued ones fail, its sequence leaves the engine."""
        session.closed = True
        for call in session.waiting:
            call.future.set_exception(GatewayError(409, f"session closed: {why}", code="session_closed"))
        session.waiting = []
        if session.seq is not None:
            self.running.pop(id(session.seq), None)
            self.engine.release(session.seq)

    def pump(self, until: Callable[[], bool], idle_wait: float = 0.005) -> None:
        """Serve calls until `until()` is true."""
        while not until():
            self._take_inbox(idle_wait if not self.engine.busy() else 0.0)
            live.take_cancels(self)
            self._admit_backlog()
            if self.engine.busy():
                for seq in self.engine.step():
                    self._turn_ended(seq)
                live.send_deltas(self)

    def _take_inbox(self, wait: float) -> None:
        try:
            call = self.inbox.get(timeout=wait) if wait else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._receive(call)
            try:
                call = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _receive(self, call: Call) -> None:
        if isinstance(call.session, str):  # a training session's id
            session = self.sessions.get(call.session)
            if session is None or session.closed:
                call.future.set_exception(GatewayError(404, f"no open session {call.session!r}",
                                                       code="session_not_found"))
                return
            call.session = session
            if session.waiting or any(c.session is session for c in self.running.values()):
                session.waiting.append(call)
                return
        else:  # a serving request: a session of its own
            self.counter += 1
            call.session = Session(f"request-{self.counter}", budget=None, ephemeral=True)
        self.backlog.append(call)

    def _admit_backlog(self) -> None:
        while self.backlog:
            call = self.backlog[0]
            if call.future.done():  # cancelled while it waited
                self.backlog.pop(0)
                self._next_of(call.session)
                continue
            needed = completions.slots_needed(call.request) if call.completion else call.request.n \
                if call.session.ephemeral else (0 if call.session.seq is not None else 1)
            if sum(s is None for s in self.engine.running) < needed:
                return
            self.backlog.pop(0)
            try:
                self._start(call)
            except GatewayError as err:
                call.future.set_exception(err)
                self._next_of(call.session)

    def _start(self, call: Call) -> None:
        session, request = call.session, call.request
        call.model, call.adapter = self.served_model(request.model) if session.ephemeral else (self.model_name, None)
        config, temperature = self.sampler(request)
        if call.completion:
            call.seqs = completions.start(self, call, config, temperature)
            if not call.seqs:  # echo only: nothing to sample
                call.future.set_result(completions.respond(self, call))
            for seq in call.seqs:
                self.running[id(seq)] = call
            return
        stops = tuple(request.stop) + (tuple(self.fmt.stop_strings) if request.tools else ())
        session.stops = tuple(request.stop)
        if session.ephemeral:  # without a seed the engine's draw gives each choice its own numbers
            for choice in range(request.n):
                rng = None if request.seed is None else np.random.default_rng([request.seed, choice])
                call.seqs.append(self._new_sample(session, request, config, temperature, stops, rng, call.adapter))
                call.seqs[-1].top_logprobs = request.top_logprobs
        else:
            if session.seq is not None and session.sample.truncated:  # as an environment's episode, it is over
                raise GatewayError(400, "this episode's token budget is spent: its last answer was cut at the "
                                        "budget (max_trajectory_tokens)", "messages", "context_length_exceeded")
            added = None if session.seq is None else render.extension(session.history, session.tools, request)
            if added is None:
                if session.seq is not None:
                    session.prefix_breaks += 1
                    self.engine.release(session.seq)
                session.seq = self._new_sample(session, request, config, temperature, stops, session.rng)
            else:
                self._extend(session, added, config, stops)
            call.seqs.append(session.seq)
        session.history, session.tools = list(request.messages), tuple(request.tools)
        for seq in call.seqs:
            self.running[id(seq)] = call
        call.id, call.created = f"{session.id}-{len(session.calls)}", int(time.time())
        if call.feed is not None:
            call.feed.put(Outcome(call.id, call.model, call.created, (), call.seqs[0].length, 0))

    def _new_sample(self, session: Session, request: ChatRequest, config: GenerationConfig, temperature: float,
                    stops: tuple, rng, adapter: Optional[int] = None) -> DecodeSequence:
        shown = render.shown(request.messages, request.tools, self.fmt)
        ids = self.tokenizer.encode(prompt_text(self.tokenizer, shown), add_special_tokens=True)
        room = self.capacity - len(ids) if session.budget is None else min(session.budget, self.capacity - len(ids))
        if room < 1:
            raise GatewayError(400, f"the prompt is {len(ids)} tokens, which leaves no room for an answer within "
                                    f"{self.capacity} tokens", "messages", "context_length_exceeded")
        session.shown = shown
        session.samples.append(Trajectory(list(ids), [0] * len(ids), [0.0] * len(ids), len(ids), [], [], shown, {}))
        session.calls.append({"sample": len(session.samples) - 1, "fed": list(ids)})
        stop = (lambda turn: self._stopped(turn, stops)) if stops else None
        seq = DecodeSequence(ids, config, len(ids) + room, rng=rng, stop=stop, log_prob_temperature=temperature,
                       adapter=adapter)
        self.engine.add(seq)
        return seq

    def _extend(self, session: Session, added, config: GenerationConfig, stops: tuple) -> None:
        new = render.shown(added, (), self.fmt)
        ids = continuation_ids(self.tokenizer, session.shown, new, session.close)
        sample = session.sample
        if len(sample.input_ids) - sample.prompt_len + len(ids) + 1 > session.seq.max_len - sample.prompt_len:
            raise GatewayError(400, "the new messages leave no room for an answer within this episode's token "
                                    "budget", "messages", "context_length_exceeded")
        session.shown = session.shown + new
        sample.input_ids.extend(ids)
        sample.action_mask.extend([0] * len(ids))
        sample.log_probs.extend([0.0] * len(ids))
        sample.messages = sample.messages + new
        session.calls.append({"sample": len(session.samples) - 1, "fed": list(ids)})
        session.seq.stop = (lambda turn: self._stopped(turn, stops)) if stops else None
        self.engine.resume(session.seq, ids, config)

    def _stopped(self, turn: List[int], stops: tuple) -> bool:
        tail = self.tokenizer.decode(turn[-(max(len(s) for s in stops) + 1):], skip_special_tokens=False)
        return any(stop in tail for stop in stops)

    def _turn_ended(self, seq: DecodeSequence) -> None:
        call = self.running.pop(id(seq), None)
        if call is None:
            return
        if call.completion:
            if not any(id(s) in self.running for s in call.seqs):
                call.future.set_result(completions.respond(self, call))
                for s in call.seqs:
                    self.engine.release(s)
            return
        session = call.session
        text = self.tokenizer.decode(seq.turn, skip_special_tokens=False)
        close = self.tokenizer.decode(seq.turn[-1:], skip_special_tokens=False) if seq.ending == "eos" else ""
        text = text[: len(text) - len(close)] if close and text.endswith(close) else text
        message = render.reply(text, self.fmt, session.stops)
        if not session.ephemeral:
            self._record_turn(session, seq, text, close, message)
        call.choices[id(seq)] = (message, text)
        if any(id(s) in self.running for s in call.seqs):
            return  # other choices of the call still sampling
        call.future.set_result(self._outcome(call))
        if session.ephemeral:
            for s in call.seqs:
                self.engine.release(s)
        self._next_of(session)

    def _record_turn(self, session: Session, seq: DecodeSequence, text: str, close: str, message) -> None:
        sample = session.sample
        sample.input_ids.extend(seq.turn)
        sample.action_mask.extend([1] * len(seq.turn))
        sample.log_probs.extend(seq.turn_log_probs)
        sample.num_turns += 1
        sample.turn_rewards.append(0.0)
        sample.turn_ends.append(len(sample.input_ids) - 1)
        # the calls the format finds, malformed ones too: what an environment counts (it answers those with an error)
        attempts = len(self.fmt.parse(render.cut(text, session.stops)))
        sample.metrics["tool_calls"] = sample.metrics.get("tool_calls", 0.0) + attempts
        sample.truncated = seq.ending == "budget"
        assistant = {"role": "assistant", "content": text}
        session.shown = session.shown + [assistant]
        sample.messages = sample.messages + [assistant]
        session.history.append(message)
        session.close = close
        session.calls[-1].update(sampled=list(seq.turn), log_probs=list(seq.turn_log_probs), ending=seq.ending)

    def _next_of(self, session: Session) -> None:
        if session.waiting:
            self.backlog.append(session.waiting.pop(0))

    def _outcome(self, call: Call) -> Outcome:
        choices = []
        for seq in call.seqs:
            message, text = call.choices[id(seq)]
            logprobs = self.logprob_entries(seq, 0) if call.request.logprobs else None
            choices.append(Choice(message, seq.ending, text, tuple(seq.turn), logprobs))
        prompt = sum(seq.fed - len(seq.turn) + 1 for seq in call.seqs[:1])  # what it fed before the turn
        return Outcome(call.id, call.model, call.created, tuple(choices), prompt,
                       sum(len(seq.turn) for seq in call.seqs))

    def logprob_entries(self, seq: Sequence, first: int) -> tuple:
        """The log-prob entries ({"token", "logprob", "bytes", "top_logprobs"}) of seq's turn from token `first`."""
        tops = seq.turn_top or [[]] * len(seq.turn)
        return tuple({**self._token(t, lp), "top_logprobs": [self._token(i, v) for i, v in top]}
                     for t, lp, top in list(zip(seq.turn, seq.turn_log_probs, tops))[first:])

    def _token(self, token: int, log_prob: float) -> dict:
        text = self.tokenizer.decode([token], skip_special_tokens=False)
        return {"token": text, "logprob": log_prob, "bytes": list(text.encode())}
