"""The one Registry type behind algorithms, compressors, problems and topologies, and its one
``module:Name[:PARAMS]`` parser and loader."""

from __future__ import annotations

import textwrap

import pytest

import topologies
from gossip.algorithms import ALGORITHMS, Algorithm, ConfigError, make_algorithm, register_algorithm
from gossip.compress import COMPRESSORS, CompressionError, TopK, make, register_compressor
from gossip.errors import PluginError
from gossip.problems import make_problem, register_problem
from gossip.problems.factory import BUILDERS
from topologies.errors import SpecError
from topologies.registry import Registry, Target, import_target, parse_target
from topologies.spec import STATIC, TIME_VARYING


class KindError(ValueError):
    pass


@pytest.fixture(autouse=True)
def restore_registries():
    """Whatever a test registers ends with it."""
    import gossip.compress as compress
    import gossip.problems.factory as problems
    from gossip.compress import wire

    saved = [(d, dict(d)) for d in (ALGORITHMS.objects, COMPRESSORS.objects, compress._KIND_CLASS,
                                    wire.KINDS, BUILDERS.objects)]
    names = list(problems.PROBLEMS)
    yield
    for live, copy in saved:
        live.clear()
        live.update(copy)
    problems.PROBLEMS[:] = names


def widget() -> str:
    return "widget"


def gadget() -> str:
    return "gadget"


PLUGIN = textwrap.dedent('''
    from gossip.compress import TopK

    def build():
        return "from the file"

    class Scaled(TopK):
        kind = 30

        def __init__(self, spec, ratio="0.5", *rest):
            super().__init__(spec, ratio=float(ratio))
            self.rest = rest

    class Scaled2(Scaled):  # the file and the module are two copies: one kind each
        kind = 29
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    path = tmp_path / "registry_plugin_mod.py"
    path.write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    return path


def test_register_get_available():
    reg = Registry("part", error=KindError)
    assert reg.register("widget", widget, color="blue") is widget

    @reg.register("gadget")
    def _gadget() -> str:
        return "gadget"

    assert reg.get("widget") is widget and reg.get(" gadget ") is _gadget
    assert reg.available() == ["gadget", "widget"] and list(reg) == ["widget", "gadget"]
    assert "widget" in reg and "nope" not in reg and 3 not in reg and len(reg) == 2
    assert reg["widget"] is widget and dict(reg) == {"widget": widget, "gadget": _gadget}
    assert reg.meta("widget") == {"color": "blue"} and reg.meta("nope") == {}


def test_same_object_twice_is_a_no_op():
    reg = Registry("part", error=KindError)
    reg.register("widget", widget)
    reg.register("gadget", gadget)
    assert reg.register("widget", widget) is widget
    assert list(reg) == ["widget", "gadget"] and reg.get("widget") is widget
    f = lambda spec: TopK(spec, ratio=0.1)  # noqa: E731
    register_compressor("tenth", f)
    register_compressor("tenth", f)  # a module imported twice
    assert isinstance(make("tenth"), TopK)


def test_another_object_under_a_taken_name_names_the_owner():
    reg = Registry("part", error=KindError)
    reg.register("widget", widget)
    with pytest.raises(KindError, match=r"a part named 'widget' is already registered "
                                        r"\(tests.scripts.test_registry.widget\); .*replace=True"):
        reg.register("widget", gadget)
    assert reg.get("widget") is widget
    register_compressor("tenth", lambda spec: TopK(spec, ratio=0.1))
    with pytest.raises(CompressionError, match=r"'tenth' is already registered \(tests.scripts.test_registry"):
        register_compressor("tenth", lambda spec: TopK(spec, ratio=0.2))
    with pytest.raises(CompressionError, match=r"'topk' is already registered \(gossip.compress._topk\)"):
        register_compressor("topk", lambda spec: TopK(spec, ratio=0.2))
    with pytest.raises(CompressionError, match=r"'none' is already registered \(gossip.compress._plain"):
        register_compressor("none", lambda spec: TopK(spec, ratio=0.2))
    with pytest.raises(ConfigError, match=r"an algorithm named 'choco' is already registered "
                                          r"\(gossip.algorithms.choco.Choco\)"):
        register_algorithm(type("Other", (ALGORITHMS.get("gossip"),), {"name": "choco"}))
    register_problem("tiny", widget)
    with pytest.raises(ConfigError, match=r"'tiny' is already registered \(tests.scripts.test_registry.widget\)"):
        register_problem("tiny", gadget)


def test_replace():
    reg = Registry("part", error=KindError)
    reg.register("widget", widget)
    assert reg.register("widget", gadget, replace=True) is gadget
    assert reg.get("widget") is gadget
    register_compressor("tenth", lambda spec: TopK(spec, ratio=0.1))
    register_compressor("tenth", lambda spec: TopK(spec, ratio=0.5), replace=True)
    assert make("tenth").ratio == 0.5
    register_problem("tiny", widget)
    assert register_problem("tiny", gadget, replace=True) is gadget


def test_bad_names_are_refused():
    reg = Registry("part", error=KindError)
    for name in ("", "a:b", " a", None):
        with pytest.raises(KindError, match="non-empty string without ':'"):
            reg.register(name, widget)


def test_unknown_name_lists_the_names_and_the_plugin_form():
    reg = Registry("part", error=KindError)
    reg.register("widget", widget)
    reg.register("gadget", gadget)
    with pytest.raises(KindError, match=r"unknown part 'nope'; choose one of: gadget, widget, or give module:Name"):
        reg.get("nope")
    with pytest.raises(KindError, match="unknown part 3"):
        reg.get(3)
    with pytest.raises(ConfigError, match=r"unknown algorithm 'chocoo' \(did you mean 'choco'\?\); "
                                          r"choose one of: .*choco.*module:Class"):
        make_algorithm("chocoo")
    with pytest.raises(ConfigError, match=r"unknown problem 'ridge'; choose one of: .*lasso.*module:function"):
        make_problem("ridge")
    with pytest.raises(CompressionError, match=r"unknown compressor 'nope'.*topk:RATIO.*module:Class\[:PARAMS\]"):
        make("nope:3")


@pytest.mark.parametrize("spec, target", [
    ("pkg.mod:Cls", Target("pkg.mod", "Cls")),
    ("pkg.mod:Outer.Inner", Target("pkg.mod", "Outer.Inner")),
    ("pkg.mod:Cls:0.1:unbiased", Target("pkg.mod", "Cls", ("0.1", "unbiased"))),
    ("pkg.mod:Cls:", Target("pkg.mod", "Cls", ("",))),
    ("path/to/file.py:Cls", Target("path/to/file.py", "Cls")),
    (" path/to/file.py:Cls:4:x ", Target("path/to/file.py", "Cls", ("4", "x"))),
    ("C:/dir/file.py:Cls:s=4", Target("C:/dir/file.py", "Cls", ("s=4",))),
    ("topk:0.01", None),  # a registry spec, not a plug-in
    ("torus:rows=4", None),
    ("erdos-renyi:p=0.3", None),
    ("no_colon", None),
    ("my-mod:Cls", None),
    (":Cls", None),
    ("mod:", None),
])
def test_one_parser(spec, target):
    assert parse_target(spec) == target


def test_plugins_resolve_through_the_one_loader(plugin):
    reg = Registry("part", error=KindError, form="module:function")
    module_fn = reg.get("registry_plugin_mod:build")
    file_fn = reg.get(f"{plugin}:build")
    assert module_fn() == file_fn() == "from the file"
    assert reg.get(f"{plugin}:build") is file_fn  # a file runs once per process
    assert import_target(f"{plugin}:Scaled:0.1", error=KindError) is reg.get(f"{plugin}:Scaled")
    with pytest.raises(KindError, match="nothing after 'build'"):
        reg.get("registry_plugin_mod:build:extra")
    with pytest.raises(KindError, match="cannot import module 'no_such_mod_xyz'"):
        reg.get("no_such_mod_xyz:f")
    with pytest.raises(KindError, match="has no attribute 'missing'"):
        reg.get("registry_plugin_mod:missing")
    with pytest.raises(KindError, match="does not exist"):
        reg.get("nowhere/none.py:f")
    # gossip's registries raise PluginError for a plug-in that cannot be imported, topologies SpecError
    with pytest.raises(PluginError, match="cannot import module 'no_such_mod_xyz'"):
        make_algorithm("no_such_mod_xyz:Alg")
    with pytest.raises(PluginError, match="has no attribute 'missing'"):
        make(f"{plugin}:missing:3")
    with pytest.raises(SpecError, match="cannot import module 'no_such_mod_xyz'"):
        topologies.load_callable("no_such_mod_xyz:f", 4)


def test_compressor_spec_params_survive_parsing(plugin):
    by_module = make("registry_plugin_mod:Scaled:0.25:x:y")
    by_file = make(f"{plugin}:Scaled2:0.25:x:y")
    for c in (by_module, by_file):
        assert c.ratio == 0.25 and c.rest == ("x", "y")
    assert make("registry_plugin_mod:Scaled").ratio == 0.5
    assert COMPRESSORS.resolve("TopK:0.5:x").params == ("0.5", "x")  # names: any case
    assert COMPRESSORS.resolve("topk:").params == ("",)
    assert COMPRESSORS.resolve("none").params == ()
    with pytest.raises(CompressionError, match="takes no parameters"):
        make("none:")


def test_every_part_kind_is_a_registry():
    for reg in (ALGORITHMS, COMPRESSORS, BUILDERS, STATIC, TIME_VARYING):
        assert isinstance(reg, Registry)
    assert issubclass(ALGORITHMS.get("choco"), Algorithm)
    assert STATIC.get("Watts_Strogatz").name == "watts-strogatz"  # topologies' aliases and case
    assert STATIC["cycle"] is STATIC["ring"] and "matchings" in TIME_VARYING
    with pytest.raises(SpecError, match="unknown topology 'nope'"):
        STATIC.get("nope")
