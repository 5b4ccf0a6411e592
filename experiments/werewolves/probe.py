"""The village's vote probe: how likely a policy's day vote is to name a wolf, computed on fixed decisions.

Takes the village's vote decisions of all-heuristic games, renders each exactly as the LLM seat does
(system prompt, compact observation, chat template, then the answer's forced prefix ``{"target":``)
and reads the next-token distribution over the legal targets' digits: the constrained decoder's own
choice at temperature 1, computed rather than sampled. A trained policy's shift is then measured
without game or sampling noise, and a policy that did not change shows exactly 0
(benchmarks/werewolves_bench.py, benchmarks/werewolves_reading.py).
"""

from __future__ import annotations

from typing import Any

import torch

from experiments.werewolves.game import WEREWOLF, Decision, Game, deal_roles, side_of
from experiments.werewolves.heuristic import HeuristicPlayer, seer_claims
from experiments.werewolves.llm_player import COMPACT_SYSTEM
from experiments.werewolves.observe import compact_observation

__all__ = ["VoteItem", "accused", "encode", "target_logprobs", "vote_decisions", "vote_items", "wolf_shares"]

# (prompt ids up to the target digit, the legal targets' digit token ids), the decision, the game's roles
VoteItem = tuple[tuple[list[int], list[int]], Decision, list[str]]


def vote_decisions(games: int, base: int) -> list[tuple[Decision, list[str]]]:
    """The village's vote decisions (with the game's roles) of ``games`` all-heuristic games from seed ``base``."""
    out: list[tuple[Decision, list[str]]] = []
    for seed in range(base, base + games):
        roles = deal_roles(seed)

        class Recorder(HeuristicPlayer):
            def act(self, d: Decision, roles: list[str] = roles) -> Any:
                if d.kind == "vote":
                    out.append((d, roles))
                return super().act(d)

        Game(roles, seed).play([Recorder(p, seed) if side_of(r) == "village" else HeuristicPlayer(p, seed)
                                for p, r in enumerate(roles)])
    return out


def accused(d: Decision) -> int | None:
    """The latest living player a seer claim accused, if any."""
    names = [t for accused in seer_claims(d.events).values() for t in accused if t in d.targets]
    return names[-1] if names else None


def encode(tok: Any, d: Decision) -> tuple[list[int], list[int]]:
    """The vote's prompt ids up to its target digit and the legal targets' digit token ids."""
    chat = [{"role": "system", "content": COMPACT_SYSTEM}, {"role": "user", "content": compact_observation(d)}]
    # the answer as the gateway's constrained decoding writes it (compact separators): {"target":4}
    text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) + '{"target":'
    return tok.encode(text, add_special_tokens=False), [tok.encode(str(t), add_special_tokens=False)[0] for t in d.targets]


def vote_items(tok: Any, games: int, base: int) -> list[VoteItem]:
    """:func:`encode`'d vote decisions of ``games`` heuristic games from seed ``base``, with the decisions and roles."""
    return [(encode(tok, d), d, roles) for d, roles in vote_decisions(games, base)]


def target_logprobs(model: Any, pad_id: int, items: list[VoteItem]) -> list[torch.Tensor]:
    """Per item, the log-probabilities over its legal targets (the digit position, masked to them)."""
    width = max(len(ids) for (ids, _), _, _ in items)
    batch = torch.full((len(items), width), pad_id)
    mask = torch.zeros_like(batch)
    for k, ((ids, _), _, _) in enumerate(items):  # left padding: the answer position is last
        batch[k, width - len(ids):] = torch.tensor(ids)
        mask[k, width - len(ids):] = 1
    dev = next(model.parameters()).device
    logits = model(input_ids=batch.to(dev), attention_mask=mask.to(dev)).logits[:, -1].float().cpu()
    return [torch.log_softmax(logits[k, cand], -1) for k, ((_, cand), _, _) in enumerate(items)]


def wolf_shares(model: Any, pad_id: int, items: list[VoteItem], batch: int = 64) -> list[float]:
    """Per decision, the probability that ``model``'s vote names a wolf: a causal LM, a peft model or a
    trainer's policy view (``get_base_model()``: the network with that policy's adapter active); no
    gradient, in eval mode, the training mode restored after."""
    net = model.get_base_model() if hasattr(model, "get_base_model") else model
    out: list[float] = []
    was_training = net.training
    net.eval()
    try:
        with torch.no_grad():
            for j in range(0, len(items), batch):
                chunk = items[j:j + batch]
                for lp, (_, d, roles) in zip(target_logprobs(net, pad_id, chunk), chunk, strict=True):
                    out.append(sum(p for t, p in zip(d.targets, lp.exp().tolist(), strict=True) if roles[t] == WEREWOLF))
    finally:
        net.train(was_training)
    return out
