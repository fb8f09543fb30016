"""The one way to write a local rewrite: a pattern (written as an expression over vars), a check that returns a
plan or a refusal sentence, and a rewrite; the matcher and the driver that applies rules to every graph."""
from worker.engine.pattern.matcher import Match, Matcher
from worker.engine.pattern.pattern import OpPattern, Pattern, VarPattern
from worker.engine.pattern.rule import Rule, apply_rules, describe, forward_refusal

__all__ = ["Match", "Matcher", "OpPattern", "Pattern", "Rule", "VarPattern", "apply_rules", "describe",
           "forward_refusal"]
