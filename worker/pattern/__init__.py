"""The pattern matcher: patterns of op and var nodes, matches from the op-type index, rewrite rules."""
from worker.pattern.matcher import Match, Matcher, find_matches
from worker.pattern.pattern import OpPattern, Pattern, VarPattern
from worker.pattern.rule import Rule, apply_rules

__all__ = ["Match", "Matcher", "OpPattern", "Pattern", "Rule", "VarPattern", "apply_rules", "find_matches"]
