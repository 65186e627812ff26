"""Human-expert rules on small hand-built graphs that follow the zoo's scope conventions."""

from __future__ import annotations

import numpy as np
import pytest

from baselines.human_expert import HumanExpert, HumanExpertPipeline, balanced_contiguous
from suite import registry
from suite.graph import Op, OpGraph
from suite.methodology import Budget
from suite.placement import validate


def forward_devices(result, graph) -> dict[str, int]:
    """Device of each forward op's scope; also checks that backward/update ops sit with their forward op."""
    out = {}
    for i, op in enumerate(graph.ops):
        if op.phase == "forward":
            out[op.scope] = int(result.placement[i])
    for i, op in enumerate(graph.ops):
        assert int(result.placement[i]) == out[op.scope]
    return out


RNNLM = ["embedding", "lstm.0", "lstm.1", "softmax"]
NMT = ["encoder.embedding", "encoder.lstm.0", "encoder.lstm.1", "decoder.embedding", "decoder.lstm.0",
       "decoder.lstm.1", "attention", "softmax"]


def test_rnnlm_one_lstm_layer_per_gpu_softmax_on_the_last(layered_graph, make_problem, haswell_4k80, haswell_2k80):
    g = layered_graph("rnnlm", RNNLM)
    r = HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0)
    assert forward_devices(r, g) == {"embedding": 1, "lstm.0": 1, "lstm.1": 2, "softmax": 4}
    assert r.info["rule"] == "lstm_per_gpu" and r.evaluations == 0
    r = HumanExpert().place(make_problem(g, haswell_2k80), Budget(), 0)
    assert forward_devices(r, g) == {"embedding": 1, "lstm.0": 1, "lstm.1": 2, "softmax": 2}


def test_rnnlm_more_layers_than_gpus_round_robin(layered_graph, make_problem, haswell_2k80):
    g = layered_graph("rnnlm", ["embedding", "lstm.0", "lstm.1", "lstm.2", "lstm.3", "lstm.4", "softmax"])
    r = HumanExpert().place(make_problem(g, haswell_2k80), Budget(), 0)
    devs = forward_devices(r, g)
    assert [devs[f"lstm.{k}"] for k in range(5)] == [1, 2, 1, 2, 1]


def test_nmt_encoder_then_decoder_layers_round_robin(layered_graph, make_problem, haswell_4k80, haswell_2k80):
    g = layered_graph("nmt", NMT)
    devs = forward_devices(HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0), g)
    assert devs == {"encoder.embedding": 1, "encoder.lstm.0": 1, "encoder.lstm.1": 2, "decoder.embedding": 1,
                    "decoder.lstm.0": 3, "decoder.lstm.1": 4, "attention": 4, "softmax": 4}
    devs = forward_devices(HumanExpert().place(make_problem(g, haswell_2k80), Budget(), 0), g)
    assert [devs[s] for s in NMT] == [1, 1, 2, 1, 1, 2, 2, 2]


RESNET = ["stem", "layer1.0", "layer1.1", "layer2.0", "head"]


def resnet_like() -> OpGraph:
    """Ops two levels below their block (e.g. layer1.0.conv1), equal FLOPs, blocks in the metadata."""
    ops, edges = [], []
    for block in RESNET:
        for j in range(2):
            name = f"{block}.op{j}"
            ops.append(Op(name, "conv", flops=1e9, output_bytes=1000, scope=f"{block}.conv{j}" if j else block))
            if ops[:-1]:
                edges.append((ops[-2].name, name))
    return OpGraph.build("resnet-like", ops, edges, {"model": "resnet50", "blocks": RESNET})


def test_cnn_whole_model_on_the_fastest_gpu(make_problem):
    cluster = registry.load_cluster("dgx_a100x8")
    r = HumanExpert().place(make_problem(resnet_like(), cluster), Budget(), 0)
    assert set(r.placement.tolist()) == {cluster.fastest("gpu")} and r.info["rule"] == "single_gpu"


def test_cnn_pipeline_variant_splits_blocks_contiguously(make_problem, haswell_2k80, haswell_4k80):
    g = resnet_like()
    r = HumanExpertPipeline().place(make_problem(g, haswell_2k80), Budget(), 0)
    assert r.info["rule"] == "block_pipeline"
    # 5 blocks of equal cost on 2 GPUs: midpoints at 10%, 30%, 50%, 70%, 90% of the work
    assert r.placement.tolist() == [1, 1, 1, 1, 2, 2, 2, 2, 2, 2]
    r = HumanExpertPipeline().place(make_problem(g, haswell_4k80), Budget(), 0)
    per_block = r.placement[::2].tolist()
    assert per_block == sorted(per_block) and per_block[0] == 1 and per_block[-1] == 4


def test_bert_contiguous_layer_blocks(layered_graph, make_problem, haswell_2k80, haswell_4k80):
    scopes = ["embeddings"] + [f"encoder.layer.{k}" for k in range(6)] + ["pooler", "head"]
    g = layered_graph("bert_base", scopes)
    devs = forward_devices(HumanExpert().place(make_problem(g, haswell_2k80), Budget(), 0), g)
    assert [devs[s] for s in scopes] == [1, 1, 1, 1, 2, 2, 2, 2, 2]
    devs = forward_devices(HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0), g)
    assert [devs[s] for s in scopes] == [1, 1, 1, 2, 2, 3, 4, 4, 4]


def test_unknown_workload_balanced_contiguous_split(layered_graph, make_problem, haswell_2k80):
    g = layered_graph("something_else", ["a", "b", "c", "d"])
    r = HumanExpert().place(make_problem(g, haswell_2k80), Budget(), 0)
    assert r.info["rule"] == "balanced_topological"
    assert [forward_devices(r, g)[s] for s in "abcd"] == [1, 1, 2, 2]


def test_unmatched_scopes_follow_the_group_before_them(layered_graph, make_problem, haswell_4k80):
    g = layered_graph("rnnlm", ["input", "embedding", "lstm.0", "lstm.1", "softmax", "loss"])
    devs = forward_devices(HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0), g)
    assert devs["input"] == 1 and devs["loss"] == devs["softmax"] == 4


def test_no_gpu_everything_on_the_cpu(layered_graph, make_problem, make_cluster):
    g = layered_graph("rnnlm", RNNLM)
    for placer in (HumanExpert(), HumanExpertPipeline()):
        assert set(placer.place(make_problem(g, make_cluster(0)), Budget(), 0).placement.tolist()) == {0}


def test_kind_constraints_move_an_op_to_an_allowed_device(make_problem, haswell_2k80):
    ops = [Op("emb", "x", flops=1e9, output_bytes=10, scope="embedding"),
           Op("l0", "x", flops=1e9, output_bytes=10, scope="lstm.0"),
           Op("host", "x", flops=1e6, output_bytes=10, scope="lstm.0", allowed_kinds=("cpu",)),
           Op("sm", "x", flops=1e9, output_bytes=10, scope="softmax")]
    g = OpGraph.build("rnnlm-kinds", ops, [("emb", "l0"), ("l0", "host"), ("host", "sm")], {"model": "rnnlm"})
    r = HumanExpert().place(make_problem(g, haswell_2k80), Budget(), 0)
    assert r.placement.tolist() == [1, 1, 0, 2] and r.info["kind_moves"] == 1


@pytest.mark.parametrize("placer", [HumanExpert, HumanExpertPipeline])
def test_valid_on_random_graphs(placer, random_graph, make_problem, haswell_4k80):
    g = random_graph(120, 3, groups=True, kinds=True)
    validate(placer().place(make_problem(g, haswell_4k80), Budget(), 0).placement, g, haswell_4k80)


def test_balanced_contiguous():
    assert balanced_contiguous([1, 1, 1, 1], 2).tolist() == [0, 0, 1, 1]
    assert balanced_contiguous([3, 1, 1, 1], 2).tolist() == [0, 1, 1, 1]
    assert balanced_contiguous([1, 1, 1], 1).tolist() == [0, 0, 0]
    parts = balanced_contiguous(np.random.default_rng(0).uniform(size=100), 7)
    assert (np.diff(parts) >= 0).all() and parts[0] == 0 and parts[-1] == 6


def _cluster(gpu_flops: list[float], cpu_flops: list[float], *, cpu_mem_bandwidth: float = 1e30):
    from suite.cluster import Cluster, Device, Link

    devs = [Device(f"cpu:{k}", "cpu", peak_flops=f, mem_bandwidth=cpu_mem_bandwidth, memory_bytes=2**40, op_overhead_s=0.0)
            for k, f in enumerate(cpu_flops)]
    devs += [Device(f"gpu:{k}", "gpu", peak_flops=f, mem_bandwidth=1e30, memory_bytes=2**40, op_overhead_s=0.0)
             for k, f in enumerate(gpu_flops)]
    return Cluster("het", tuple(devs), (Link(tuple(d.name for d in devs), bandwidth=1e9, latency_s=0.0),))


def test_cnn_single_gpu_is_the_fastest_not_the_first(make_problem):
    cluster = _cluster([1e10, 3e10, 2e10], [1e9])  # cpu:0, gpu:0, gpu:1 (fastest), gpu:2
    r = HumanExpert().place(make_problem(resnet_like(), cluster), Budget(), 0)
    assert set(r.placement.tolist()) == {2}


def test_no_gpu_uses_the_fastest_cpu(layered_graph, make_problem):
    cluster = _cluster([], [1e9, 4e9])
    for placer in (HumanExpert(), HumanExpertPipeline()):
        r = placer.place(make_problem(layered_graph("rnnlm", RNNLM), cluster), Budget(), 0)
        assert set(r.placement.tolist()) == {1}


def test_nmt_attention_goes_to_the_last_gpu(layered_graph, make_problem, haswell_4k80):
    """One layer each: encoder.lstm.0 on G[0], decoder.lstm.0 on G[1]; attention and softmax on G[-1], not
    after the decoder layer."""
    scopes = ["encoder.embedding", "encoder.lstm.0", "decoder.embedding", "decoder.lstm.0", "attention", "softmax"]
    g = layered_graph("nmt", scopes)
    devs = forward_devices(HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0), g)
    assert [devs[s] for s in scopes] == [1, 1, 1, 2, 4, 4]


def test_splits_balance_compute_time_on_the_fastest_gpu(make_problem):
    """Four equal-FLOP ops; "a" reads 2e10 B, which makes it 20x slower on the CPU (1 GB/s) but not on the
    GPUs. Balanced on GPU time (1:1:1:1) the split is a, b | c, d; on CPU time (20:1:1:1) it would be a | b, c, d."""
    cluster = _cluster([1e10, 1e10], [1e9], cpu_mem_bandwidth=1e9)
    ops = [Op(s, "x", flops=1e9, bytes_read=int(2e10) if s == "a" else 0, output_bytes=10, scope=s) for s in "abcd"]
    edges = [("a", "b"), ("b", "c"), ("c", "d")]
    with_blocks = OpGraph.build("blocks", ops, edges, {"model": "cnn", "blocks": list("abcd")})
    without = OpGraph.build("plain", ops, edges, {"model": "other"})
    r = HumanExpertPipeline().place(make_problem(with_blocks, cluster), Budget(), 0)
    assert r.info["rule"] == "block_pipeline" and r.placement.tolist() == [1, 1, 2, 2]
    for placer in (HumanExpertPipeline(), HumanExpert()):
        r = placer.place(make_problem(without, cluster), Budget(), 0)
        assert r.info["rule"] == "balanced_topological" and r.placement.tolist() == [1, 1, 2, 2]


def test_scope_matching_is_by_whole_path_components():
    from baselines.human_expert import _block_of, in_scope

    assert in_scope("layer1.1", "layer1.1") and in_scope("layer1.1.conv1", "layer1.1")
    assert not in_scope("layer1.10.conv1", "layer1.1") and not in_scope("embeddings", "embedding")
    # the longest (innermost) block that contains the scope wins
    assert _block_of("encoder.layer.1.attn", ["encoder", "encoder.layer.1"]) == 1
    assert _block_of("decoder.x", ["encoder", "encoder.layer.1"]) == -1


def test_balanced_contiguous_without_costs_splits_by_count():
    assert balanced_contiguous([0, 0, 0, 0], 2).tolist() == [0, 0, 1, 1]
    assert balanced_contiguous([0.0] * 5, 3).tolist() == [0, 0, 1, 1, 2]  # floor(3k/5) for k = 0..4


def test_bert_with_more_gpus_than_layers_keeps_pooler_and_head_with_the_last_block(layered_graph, make_problem,
                                                                                   haswell_4k80):
    """2 encoder layers on 4 GPUs (devices 1..4): one layer each on gpu 1 and 2, the embeddings with the first
    block, pooler and head with the last (gpu 2), not on the last GPU (4), which holds no layer."""
    scopes = ["embeddings", "encoder.layer.0", "encoder.layer.1", "pooler", "head"]
    g = layered_graph("bert_base", scopes)
    devs = forward_devices(HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0), g)
    assert [devs[s] for s in scopes] == [1, 1, 2, 2, 2]


def test_a_rule_that_finds_none_of_its_layers_is_not_named(layered_graph, make_problem, haswell_4k80):
    """Scopes named otherwise ("rnn.0" for an LSTM layer, "blocks.0" for a BERT layer, no listed block): the
    rule's layer split does not happen, and the label says so instead of naming the split. What the rule's
    other parts match still goes where they put it (rnnlm: embedding on G[0], softmax on G[-1])."""
    g = layered_graph("rnnlm", ["embedding", "rnn.0", "rnn.1", "softmax"])
    r = HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0)
    assert r.info["rule"] == "no_layer_matched"
    assert forward_devices(r, g) == {"embedding": 1, "rnn.0": 1, "rnn.1": 1, "softmax": 4}
    g = layered_graph("nmt", ["encoder.rnn", "decoder.rnn"])
    r = HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0)
    assert r.info["rule"] == "no_layer_matched" and set(r.placement.tolist()) == {1}
    g = layered_graph("bert_base", ["embeddings", "blocks.0", "blocks.1", "head"])
    r = HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0)
    assert r.info["rule"] == "no_layer_matched"
    assert forward_devices(r, g) == {"embeddings": 1, "blocks.0": 1, "blocks.1": 1, "head": 4}
    g = OpGraph.build("cnn", [Op("a", "conv", flops=1e9, scope="stem"), Op("b", "conv", flops=1e9, scope="fc")],
                      [("a", "b")], {"model": "resnet50", "blocks": ["layer1", "layer2"]})
    r = HumanExpertPipeline().place(make_problem(g, haswell_4k80), Budget(), 0)
    assert r.info["rule"] == "no_layer_matched" and r.placement.tolist() == [1, 1]
    # one layer found is enough for the rule's name
    g = layered_graph("rnnlm", ["embedding", "lstm.0", "rnn.1", "softmax"])
    assert HumanExpert().place(make_problem(g, haswell_4k80), Budget(), 0).info["rule"] == "lstm_per_gpu"


def test_nmt_layer_slots_and_spare_gpus_as_the_docstring_states(layered_graph, make_problem, make_cluster):
    """The rule pinned where it departs from Sutskever et al. / GNMT (layer k of the encoder and of the
    decoder on GPU k, spare GPUs for the softmax) and where it agrees. Devices: cpu 0, GPUs 1..|G|."""
    def nmt(n):
        return (["encoder.embedding", *[f"encoder.lstm.{k}" for k in range(n)], "decoder.embedding",
                 *[f"decoder.lstm.{k}" for k in range(n)], "attention", "softmax"])

    def place(scopes, gpus):
        g = layered_graph("nmt", scopes)
        devs = forward_devices(HumanExpert().place(make_problem(g, make_cluster(gpus)), Budget(), 0), g)
        return [devs[s] for s in scopes]

    # 2+2 layers on 8 GPUs: the decoder gets GPUs of its own (3, 4), attention and softmax share the last
    # GPU (8), GPUs 5..7 stay idle
    assert place(nmt(2), 8) == [1, 1, 2, 1, 3, 4, 8, 8]
    # 4+4 layers on 4 GPUs: slots 4..7 wrap round, so layer k of both is on GPU k, as in the sources;
    # attention and softmax go with the top decoder layer (no GPU spare)
    assert place(nmt(4), 4) == [1, 1, 2, 3, 4, 1, 1, 2, 3, 4, 4, 4]
    # 4+4 layers on 2 GPUs (more layers than GPUs): round-robin, not contiguous blocks
    assert place(nmt(4), 2) == [1, 1, 2, 1, 2, 1, 1, 2, 1, 2, 2, 2]


def test_rnnlm_softmax_on_the_last_gpu_when_gpus_outnumber_layers(layered_graph, make_problem, make_cluster):
    g = layered_graph("rnnlm", RNNLM)
    devs = forward_devices(HumanExpert().place(make_problem(g, make_cluster(8)), Budget(), 0), g)
    assert devs == {"embedding": 1, "lstm.0": 1, "lstm.1": 2, "softmax": 8}


def test_balanced_contiguous_keeps_a_free_last_item_in_the_last_part():
    """The last item costs nothing: its midpoint is the total, which would be part `parts` (one past the
    last GPU); it stays in the last part."""
    assert balanced_contiguous([1.0, 1.0, 0.0], 2).tolist() == [0, 1, 1]


def test_the_balanced_split_weighs_ops_by_their_time_on_the_fastest_gpu(make_problem):
    """Four ops in a chain; gpu:0 (the fastest) takes 1 s for each, gpu:1 8 s for the memory-bound first and
    2 s for the others. Balanced by the times on gpu:0 the split is 2 + 2 ops; by gpu:1's it would be 1 + 3."""
    from suite.cluster import Cluster, Device, Link

    devs = (Device("gpu:0", "gpu", peak_flops=2e10, mem_bandwidth=1e30, memory_bytes=2**40, op_overhead_s=0.0),
            Device("gpu:1", "gpu", peak_flops=1e10, mem_bandwidth=1e9, memory_bytes=2**40, op_overhead_s=0.0))
    cluster = Cluster("het", devs, (Link(("gpu:0", "gpu:1"), bandwidth=1e9, latency_s=0.0),))
    ops = [Op(f"o{i}", "x", flops=2e10, bytes_read=int(8e9) if i == 0 else 0, output_bytes=8) for i in range(4)]
    g = OpGraph.build("chain", ops, [(f"o{i}", f"o{i + 1}") for i in range(3)], {"model": "other"})
    problem = make_problem(g, cluster)
    assert problem.costs().tolist() == [[1.0, 8.0], [1.0, 2.0], [1.0, 2.0], [1.0, 2.0]]
    r = HumanExpert().place(problem, Budget(), 0)
    assert r.placement.tolist() == [0, 0, 1, 1] and r.info["rule"] == "balanced_topological"


def test_an_lstm_layer_scope_ends_at_the_layer_number():
    """"lstm.1" and what is inside it ("lstm.1.cell") are layer 1; "lstm.1b" is another module."""
    from baselines.human_expert import _lstm_layer

    assert _lstm_layer("lstm.1", [""]) == (0, 1) and _lstm_layer("lstm.12.cell", [""]) == (0, 12)
    assert _lstm_layer("decoder.lstm.0.cell", ["encoder", "decoder"]) == (1, 0)
    assert _lstm_layer("lstm.1b", [""]) is None and _lstm_layer("lstm.1_proj.w", [""]) is None


def test_pipeline_stages_balance_block_compute_and_a_heavy_first_block_leaves_the_first_gpu(make_problem,
                                                                                           make_cluster):
    """Blocks a, b, c of 10:1:1 GFLOPs on 4 GPUs (devices 1-4): midpoints at 5, 10.5 and 11.5 of 12, so a is
    stage 1 (gpu:1) and b, c stage 3 (gpu:3); GPU 0 stays idle. By block count it would be 1, 3, 4."""
    ops = [Op(s, "x", flops=f, output_bytes=10, scope=s) for s, f in (("a", 1e10), ("b", 1e9), ("c", 1e9))]
    g = OpGraph.build("blocks", ops, [("a", "b"), ("b", "c")], {"model": "cnn", "blocks": list("abc")})
    r = HumanExpertPipeline().place(make_problem(g, make_cluster(4)), Budget(), 0)
    assert r.info["rule"] == "block_pipeline" and r.placement.tolist() == [2, 4, 4]
