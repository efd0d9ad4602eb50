"""The adapter tests' shared checks live in ``helpers``: pytest rewrites their asserts too,
so a failing check shows the values it compared."""

import pytest

pytest.register_assert_rewrite("helpers")
