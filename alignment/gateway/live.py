"""The backend's side of streamed calls (backend.py; the protocol side is streaming.py), in the pumping thread.

After each engine step, every streamed call's choice whose turn goes on gets a `Delta` when its text has grown past
what it sent: the turn decoded so far, settled (streaming.settled: whole characters, no stop string nor a tail that
could begin one, nothing a tool call's parse would take out of the content), with the log-probs of the tokens
sampled since its previous delta. The engine is not touched: a sequence's tokens are read between steps, so a
streamed turn samples the same bits as an unstreamed one. A turn that ends sends no delta: its outcome carries the
rest.

A client that goes away mid-stream (backend.Gateway.cancel) cancels its call at the next step: the call fails, its
sequences leave the engine (their slots free for the next calls); a training session's call closes the session
(the agent is gone mid-turn: the turns recorded before stay, the cut turn is not recorded)."""
from __future__ import annotations

import queue

from alignment.gateway import streaming
from alignment.gateway.protocol import GatewayError
from alignment.models.sequence import PAUSED


def send_deltas(gateway) -> None:
    """Each streamed call in the engine: a Delta per choice whose settled text grew."""
    calls = {id(call): call for call in gateway.running.values() if call.feed is not None}
    for call in calls.values():
        stops = call.session.stops  # the request's stop strings: the reply is cut at them
        for index, seq in enumerate(call.seqs):
            if seq.state == PAUSED or id(seq) not in gateway.running or not seq.turn:
                continue
            text = gateway.tokenizer.decode(seq.turn, skip_special_tokens=False)
            grown = call.feed.advance(index, streaming.settled(text, stops, getattr(gateway.fmt, "OPEN", None)),
                                      len(seq.turn))
            if grown is not None:
                new, first = grown
                entries = gateway.logprob_entries(seq, first) if call.request.logprobs else ()
                call.feed.put(streaming.Delta(index, new, entries))


def take_cancels(gateway) -> None:
    while True:
        try:
            cancel(gateway, gateway.cancels.get_nowait())
        except queue.Empty:
            return


def cancel(gateway, call) -> None:
    """End a streamed call whose client went away: it fails (nobody reads it), its sequences leave the engine. A
    call still waiting (in the inbox, the backlog or behind its session's call in flight) is dropped when its
    turn comes (its future is done)."""
    if call.future.done():
        return
    call.future.set_exception(GatewayError(499, "the client closed the streamed call", code="client_closed"))
    if not any(id(seq) in gateway.running for seq in call.seqs):
        return
    for seq in call.seqs:
        gateway.running.pop(id(seq), None)
        gateway.engine.release(seq)
    if call.session.ephemeral:
        gateway._next_of(call.session)
    else:
        gateway.close_session(call.session, "its agent closed a streamed call mid-turn")
