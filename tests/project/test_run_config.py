"""run_config: the typed run config every package reads, and the import graph it sits in."""

import dataclasses

import pytest

import run_config
from configs import ConfigError, default, tiny
from scripts.import_graph import circles, graph, upward


def test_a_config_file_and_its_record_make_the_same_typed_config():
    """tiny.py built: its values, the fields it does not set from default.py, derived values
    once; to_dict is the ConfigDict's own nesting (what checkpoints held before the typed
    config), and builds back to the same config."""
    values = tiny.get_config()
    config = run_config.build(values)
    assert (config.seq_len, config.model.d_model, config.data.source) == (128, 64, "stdlib")
    assert config.tokens_per_step == 4 * 128 and config.block(2) == 64
    assert config.parallel.tiles == (0, 0) and run_config.build(default.get_config()).parallel \
        .tiles is None  # 0: the kernel's default; 'auto': the planner's
    assert run_config.to_dict(config) == values.to_dict()
    assert run_config.build(run_config.to_dict(config)) == config
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.seq_len = 256


def test_replace_keeps_what_it_does_not_name_and_refuses_what_is_no_field():
    config = run_config.build(tiny.get_config())
    longer = run_config.replace(config, {"seq_len": 256, "model.rope_scaling": {"factor": 4.0},
                                         "model.vocab_size": 1024})
    assert (longer.seq_len, longer.model.rope_scaling.factor) == (256, 4.0)
    assert longer.model.rope_scaling.beta_fast == config.model.rope_scaling.beta_fast
    assert longer.data.vocab_size == 1024  # one value, as default.py shares it
    assert config.seq_len == 128  # the original stays
    with pytest.raises(ConfigError, match="'model.rope_thetaa' is not a config field"):
        run_config.replace(config, {"model.rope_thetaa": 1.0})


@pytest.mark.parametrize("values,message", [
    ({"seq_lenn": 4}, "config field seq_lenn does not exist"),
    ({"model": {"moe": {"top_kk": 2}}}, "config field model.moe.top_kk does not exist"),
    ({"parallel": {"attention": "ring"}}, "config field parallel.attention was renamed "
                                          "parallel.layout"),
    ({"model": {"tile_q": 64}}, "config field model.tile_q moved into parallel.tile"),
    ({"model": {"moe": {"num_experts": 4, "router": "hash"}}}, "model.moe: router 'hash'"),
])
def test_a_field_that_is_no_field_is_one_line(values, message):
    with pytest.raises(ConfigError, match=message):
        run_config.build(values)
    assert run_config.build({"seq_lenn": 4}, strict=False).seq_len == 1024  # a record: dropped


def test_the_import_graph_has_no_circle_and_no_upward_import():
    """scripts/import_graph.py over the product's modules: the packages in their layers."""
    edges = graph()
    assert "run_config.build" in edges and "training.loop" in edges["train"] | set().union(
        *(edges[m] for m in edges["train"]))
    assert circles(edges) == [] and upward(edges) == []


def test_every_field_is_declared_once_with_a_comment():
    """Each field's type, default and comment are in one place, its section's dataclass: every
    field has a comment on its line, above its group of lines, or in the class's docstring;
    configs/default.py is that declaration's ConfigDict (every field at its default, nothing
    else) and builds back to RunConfig()."""
    import inspect
    import tokenize

    from model.config import MemorySwitches, ModelConfig
    from model.rope import RopeScaling
    from model.sections import LinearAttentionConfig, MambaConfig, MLAConfig, MoEConfig
    from run_config import schema
    classes = (schema.RunConfig, schema.ParallelConfig, schema.MeshConfig, schema.DataConfig,
               schema.OptimConfig, schema.ProfileConfig, ModelConfig, MemorySwitches, MoEConfig,
               MLAConfig, LinearAttentionConfig, MambaConfig, RopeScaling)
    bare = []
    for cls in classes:
        lines, _ = inspect.getsourcelines(cls)
        comments = {tok.start[0] - 1 for tok in tokenize.generate_tokens(iter(lines).__next__)
                    if tok.type == tokenize.COMMENT}
        own = {f.name for f in dataclasses.fields(cls)} - (
            {f.name for f in dataclasses.fields(MemorySwitches)} if cls is ModelConfig else set())
        for name in own:
            at = next(i for i, line in enumerate(lines)
                      if line.strip().startswith(f"{name}:"))
            above = at  # up over a group of fields that share the comment above them
            while above > 0 and (above - 1) not in comments and ": " in lines[above - 1] \
                    and " = " in lines[above - 1]:
                above -= 1
            block = lines[above - 1].strip().startswith("#")
            if not (at in comments or block or f"{name}" in (cls.__doc__ or "")):
                bare.append(f"{cls.__name__}.{name}")
    assert not bare, " ".join(bare)
    assert run_config.build(default.get_config()) == schema.RunConfig()
    assert run_config.plain(default.get_config()) == run_config.to_dict(schema.RunConfig())
