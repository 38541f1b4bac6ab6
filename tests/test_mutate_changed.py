"""`make mutate-changed` runs the mutants of exactly the functions a diff touched: a change
missed is a change whose tests nobody checked, a function too many only costs time."""

from __future__ import annotations

from tests.mutate_changed import (
    changed_lines,
    is_mutated,
    module_name,
    mutant_globs,
    survivors_of,
)

DIFF = """\
diff --git a/fleet_import/tenants/registry.py b/fleet_import/tenants/registry.py
index 1111111..2222222 100644
--- a/fleet_import/tenants/registry.py
+++ b/fleet_import/tenants/registry.py
@@ -12 +12 @@ one line changed
-old
+new
@@ -20,0 +21,3 @@ three lines added
+a
+b
+c
@@ -40,2 +42,0 @@ two lines deleted
-x
-y
diff --git a/fleet_import/tenants/gone.py b/fleet_import/tenants/gone.py
deleted file mode 100644
--- a/fleet_import/tenants/gone.py
+++ /dev/null
@@ -1,3 +0,0 @@
-a
-b
-c
"""

SOURCE = '''\
"""A module."""

LIMIT = 3


@decorated
def first(a):
    def nested():
        return a
    return nested


class Registry:
    def get(self):
        return 1

    async def reload(self):
        return 2


def last():
    return 3
'''


def test_added_and_changed_lines_are_the_new_files_and_a_deletion_marks_both_sides() -> None:
    assert changed_lines(DIFF) == {"fleet_import/tenants/registry.py": {12, 21, 22, 23, 42, 43}}


def test_a_function_is_touched_from_its_decorator_to_its_last_line_nested_ones_included() -> None:
    module = "fleet_import.tenants.registry"
    assert mutant_globs(module, SOURCE, {6}) == [f"{module}.x_first__mutmut_*"]
    assert mutant_globs(module, SOURCE, {9}) == [f"{module}.x_first__mutmut_*"]
    assert mutant_globs(module, SOURCE, {3, 12, 13}) == []


def test_methods_are_named_by_class_and_every_touched_function_is_run() -> None:
    module = "m"
    assert mutant_globs(module, SOURCE, {15, 18, 22}) == [
        "m.x\u01c1Registry\u01c1get__mutmut_*",
        "m.x\u01c1Registry\u01c1reload__mutmut_*",
        "m.x_last__mutmut_*",
    ]


def test_only_python_files_of_the_mutated_paths_count() -> None:
    mutated = ["fleet_import/importing/guards.py", "fleet_import/tenants/*"]
    assert is_mutated("fleet_import/tenants/registry.py", mutated)
    assert is_mutated("fleet_import/importing/guards.py", mutated)
    assert not is_mutated("fleet_import/importing/guards_more.py", mutated)
    assert not is_mutated("fleet_import/tenantsx/a.py", mutated)
    assert not is_mutated("fleet_import/store/queries.sql", ["fleet_import/store/*"])
    assert module_name("fleet_import/tenants/registry.py") == "fleet_import.tenants.registry"
    assert module_name("fleet_import/tenants/__init__.py") == "fleet_import.tenants"


def test_only_the_changed_functions_survivors_are_reported() -> None:
    results = (
        "    m.x_first__mutmut_2: survived\n"
        "    m.x_firstborn__mutmut_1: survived\n"
        "    m.x\u01c1Registry\u01c1get__mutmut_4: timeout\n"
        "    m.x_last__mutmut_1: survived\n"
    )
    globs = ["m.x_first__mutmut_*", "m.x\u01c1Registry\u01c1get__mutmut_*"]
    assert survivors_of(results, globs) == [
        "m.x_first__mutmut_2: survived",
        "m.x\u01c1Registry\u01c1get__mutmut_4: timeout",
    ]
