"""Rewards: gold judges and rule rewards (pure Python), reward-function specs, and the end reward of a rollout
(reward-model score + weighted functions)."""
