"""CoverageScope names the tiers neutrally: all_tiers counts the pool and every backing tier, and
the older local_and_remote is the same member (a deprecated alias, as Python's enum makes one)."""

import hsstore
from conftest import CHUNK, rows


def test_the_older_scope_name_is_the_all_tiers_member():
    scope = hsstore.CoverageScope
    assert scope.local_and_remote is scope.all_tiers
    assert scope.__members__["local_and_remote"] is scope.all_tiers
    assert [m.name for m in scope] == ["local", "all_tiers"]


def test_all_tiers_counts_what_local_and_remote_counted(fix):
    tokens = list(range(2 * CHUNK))
    fix.mark_kv_present(fix.keys_for(tokens))
    fix.store.store_hidden_states(tokens, rows(2 * CHUNK))
    assert fix.store.coverage(tokens, [0], scope=hsstore.CoverageScope.all_tiers) == 2 * CHUNK
    assert fix.store.coverage(tokens, [1], scope=hsstore.CoverageScope.all_tiers) == 0
