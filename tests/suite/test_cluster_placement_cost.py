"""Clusters (presets and errors), placement validation and the cost model's profile mode."""

import copy
import datetime
import hashlib
import json
import struct

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from suite import Op, OpGraph, load_cluster, simulate
from suite.cluster import DEVICE_NUMBERS, from_dict, preset_names, unsourced
from suite.costmodel import Profile, cost_matrix, load_profile
from suite.errors import ClusterError, GraphError, PlacementError, ProfileError, UnknownNameError
from suite.placement import load_placement, placement_hash, save_placement, validate

PRESETS = ["dgx_a100x8", "haswell_2k80", "haswell_4k80", "hgx_a100x4", "xeon_h100"]


def test_presets_exist_and_every_number_has_a_source():
    assert preset_names() == PRESETS
    for name in PRESETS:
        c = load_cluster(name)
        assert c.devices[0].kind == "cpu" and c.device_indices("gpu")
        assert unsourced(c) == [], name


def test_the_fastest_device_of_a_kind_is_the_first_on_ties():
    c = load_cluster("haswell_2k80")  # gpu:0 and gpu:1 are the same K80 chip
    assert (c.fastest("gpu"), c.fastest("cpu")) == (1, 0)
    # effective peak: 2e12 FLOP/s at 25% (5e11) is slower than 1e12 at 100%
    devs = [dict(name="g0", kind="gpu", peak_flops=2e12, compute_efficiency=0.25, mem_bandwidth=1e9, memory_bytes=10,
                 op_overhead_s=0), dict(name="g1", kind="gpu", peak_flops=1e12, mem_bandwidth=1e9, memory_bytes=10,
                                        op_overhead_s=0)]
    assert from_dict({"name": "eff", "devices": devs, "links": [dict(between=["g0", "g1"], bandwidth=1.0,
                                                                       latency_s=0.0)]}).fastest("gpu") == 1


def test_unsourced_numbers_are_named():
    data = json.loads(json.dumps(GOOD_CLUSTER))
    c = from_dict(data)
    assert unsourced(c) == [f"{d}.{k}" for d in ("a", "b") for k in DEVICE_NUMBERS] + [
        "links[0].bandwidth", "links[0].latency_s"]
    data["devices"][0]["source"] = {k: "datasheet" for k in DEVICE_NUMBERS if k != "memory_bytes"}
    data["links"][0]["source"] = {"bandwidth": "spec", "latency_s": "measured"}
    assert unsourced(from_dict(data)) == ["a.memory_bytes", *(f"b.{k}" for k in DEVICE_NUMBERS)]
    data["devices"][0]["source"]["memory_bytes"] = ""  # an empty source is none
    data["links"][0]["source"]["latency_s"] = ""
    assert unsourced(from_dict(data)) == ["a.memory_bytes", *(f"b.{k}" for k in DEVICE_NUMBERS), "links[0].latency_s"]


def test_an_efficiency_left_at_its_default_needs_a_source():
    """Named by hand, not through DEVICE_NUMBERS (the test above builds its expectation from it): a device whose
    file gives no efficiencies runs at 1.0 of peak, an assumption that must be sourced like any number."""
    data = json.loads(json.dumps(GOOD_CLUSTER))
    sourced = ("peak_flops", "mem_bandwidth", "memory_bytes", "op_overhead_s")
    for dev in data["devices"]:
        dev["source"] = dict.fromkeys(sourced, "datasheet")
    data["devices"][1]["source"]["compute_efficiency"] = "assumption"
    data["links"][0]["source"] = {"bandwidth": "spec", "latency_s": "measured"}
    assert unsourced(from_dict(data)) == ["a.compute_efficiency", "a.memory_efficiency", "b.memory_efficiency"]


def test_k80_presets_match_the_paper_setup():
    for name, gpus in (("haswell_2k80", 2), ("haswell_4k80", 4)):
        c = load_cluster(name)
        assert len(c.device_indices("gpu")) == gpus and len(c.device_indices("cpu")) == 1
        assert all(c.devices[i].memory_bytes == 11441 * 2**20 for i in c.device_indices("gpu"))


def test_routes_take_the_best_direct_link():
    c = load_cluster("dgx_a100x8")
    lat, bw = c.routes
    g0, g1, cpu = c.index["gpu:0"], c.index["gpu:1"], c.index["cpu:0"]
    assert bw[g0, g1] == 3.0e11 and lat[g0, g1] == 3.0e-6  # NVSwitch, not PCIe
    assert bw[cpu, g0] == 2.5e10
    assert c.transfer_time_s(g0, g1, 3.0e11) == pytest.approx(1.0 + 3.0e-6)


def test_multi_hop_route_sums_latency_and_takes_min_bandwidth():
    devs = [dict(name=n, kind="gpu", peak_flops=1, mem_bandwidth=1, memory_bytes=1, op_overhead_s=0) for n in "abc"]
    c = from_dict({"name": "line", "devices": devs, "links": [
        dict(between=["a", "b"], bandwidth=100.0, latency_s=1.0), dict(between=["b", "c"], bandwidth=10.0, latency_s=2.0)]})
    lat, bw = c.routes
    assert lat[0, 2] == 3.0 and bw[0, 2] == 10.0


def test_among_fewest_link_routes_the_widest_then_the_quickest_wins():
    """a reaches d over b (slow) or over c (fast), two links either way; a slow direct link a-e beats the
    fast two-link route a-c-e (fewest links first)."""
    devs = [dict(name=n, kind="gpu", peak_flops=1, mem_bandwidth=1, memory_bytes=1, op_overhead_s=0) for n in "abcde"]
    links = [dict(between=["a", "b"], bandwidth=1.0, latency_s=0.0), dict(between=["b", "d"], bandwidth=1.0, latency_s=0.0),
             dict(between=["a", "c"], bandwidth=1e6, latency_s=1.0), dict(between=["c", "d"], bandwidth=1e6, latency_s=1.0),
             dict(between=["c", "e"], bandwidth=1e6, latency_s=1.0), dict(between=["a", "e"], bandwidth=5.0, latency_s=0.5)]
    lat, bw = from_dict({"name": "mesh", "devices": devs, "links": links}).routes
    assert (bw[0, 3], lat[0, 3]) == (1e6, 2.0)  # a-c-d, not a-b-d (listed first, lower device index)
    assert (bw[0, 4], lat[0, 4]) == (5.0, 0.5)  # the direct link
    same_width = [*links[:4], dict(between=["b", "d"], bandwidth=1e6, latency_s=0.1),
                  dict(between=["a", "b"], bandwidth=1e6, latency_s=0.1)]
    lat, bw = from_dict({"name": "mesh2", "devices": devs[:4], "links": same_width}).routes
    assert (bw[0, 3], lat[0, 3]) == (1e6, 0.2)  # equally wide: the least latency (a-b-d)


def test_the_least_latency_is_taken_among_routes_of_the_final_width_not_the_widest_prefix():
    """s reaches v over a (wide, 10 s) or b (narrow, 0.2 s); v-w is as narrow as b: both s-w routes are 5 wide,
    so the quick one wins though s-a-v is the better route to v. A narrower parallel link with less latency
    wins the same way when the route is no wider than it."""
    devs = [dict(name=n, kind="gpu", peak_flops=1, mem_bandwidth=1, memory_bytes=1, op_overhead_s=0) for n in "sabvw"]
    links = [dict(between=["s", "a"], bandwidth=10.0, latency_s=5.0), dict(between=["a", "v"], bandwidth=10.0, latency_s=5.0),
             dict(between=["s", "b"], bandwidth=5.0, latency_s=0.1), dict(between=["b", "v"], bandwidth=5.0, latency_s=0.1),
             dict(between=["v", "w"], bandwidth=5.0, latency_s=0.1)]
    c = from_dict({"name": "mesh", "devices": devs, "links": links})
    lat, bw = c.routes
    assert (bw[0, 3], lat[0, 3]) == (10.0, 10.0) and c.route(0, 3) == [(0, 1, 0), (1, 3, 1)]  # s-a-v
    assert (bw[0, 4], lat[0, 4]) == (5.0, 0.1 + 0.1 + 0.1) and c.route(0, 4) == [(0, 2, 2), (2, 3, 3), (3, 4, 4)]
    parallel = [dict(between=["s", "a"], bandwidth=10.0, latency_s=5.0), dict(between=["s", "a"], bandwidth=6.0, latency_s=1.0),
                dict(between=["a", "b"], bandwidth=5.0, latency_s=1.0)]
    c = from_dict({"name": "parallel", "devices": devs[:3], "links": parallel})
    assert c.route(0, 1) == [(0, 1, 0)] and c.route(0, 2) == [(0, 1, 1), (1, 2, 2)]
    assert (c.routes[0][0, 2], c.routes[1][0, 2]) == (2.0, 5.0)


def test_of_equal_routes_the_first_in_breadth_first_order_by_device_index_is_taken():
    """Two routes 0-1-4-5 and 0-2-3-5, alike in links, width and latency: the route through the lower device
    index at the last layer (3, before 4) is taken, though 4 is reached first (from 1); and the same route
    wherever it is listed. Which links a transfer takes sets the simulated link bytes and contention."""
    devs = [dict(name=f"d{i}", kind="gpu", peak_flops=1, mem_bandwidth=1, memory_bytes=1, op_overhead_s=0)
            for i in range(6)]
    pairs = [("d0", "d1"), ("d0", "d2"), ("d1", "d4"), ("d2", "d3"), ("d3", "d5"), ("d4", "d5")]
    for order in (pairs, pairs[::-1]):
        links = [dict(between=list(p), bandwidth=1.0, latency_s=0.5) for p in order]
        c = from_dict({"name": "ring", "devices": devs, "links": links})
        j = {p: k for k, p in enumerate(order)}
        assert c.route(0, 5) == [(0, 2, j["d0", "d2"]), (2, 3, j["d2", "d3"]), (3, 5, j["d3", "d5"])]
        assert (c.routes[0][0, 5], c.routes[1][0, 5]) == (1.5, 1.0)


def _best_route_by_enumeration(c, s, t):
    """(links, -width, latency) of the best simple route from s to t, trying every one."""
    best = None
    stack = [(s, (s,), 0.0, np.inf)]
    while stack:
        v, seen, lat, width = stack.pop()
        if v == t:
            key = (len(seen) - 1, -width, lat)
            best = key if best is None or key < best else best
            continue
        for link in c.links:
            ids = [c.index[d] for d in link.between]
            if v in ids:
                for w in ids:
                    if w not in seen:
                        stack.append((w, (*seen, w), lat + link.latency_s, min(width, link.bandwidth)))
    return best


@settings(max_examples=60, deadline=None)
@given(st.integers(3, 6), st.lists(st.tuples(st.lists(st.integers(0, 5), min_size=2, max_size=4),
                                             st.sampled_from([1.0, 2.0, 5.0]), st.sampled_from([0.0, 0.1, 0.25, 1.0])),
                                   min_size=2, max_size=12))
def test_routes_equal_the_best_of_every_route(n, raw):
    """Fewest links, then widest, then least latency, as enumerating every simple route finds; the hops
    listed are a route with those numbers. Links join 2 to 4 devices, and pairs may have parallel links."""
    links = [dict(between=[f"d{k}" for k in dict.fromkeys(x % n for x in ends)], bandwidth=bw, latency_s=lat)
             for ends, bw, lat in raw if len({x % n for x in ends}) > 1]
    links += [dict(between=[f"d{i}", f"d{i + 1}"], bandwidth=1.0, latency_s=1.0) for i in range(n - 1)]  # connected
    devs = [dict(name=f"d{i}", kind="gpu", peak_flops=1, mem_bandwidth=1, memory_bytes=1, op_overhead_s=0) for i in range(n)]
    c = from_dict({"name": "random", "devices": devs, "links": links})
    lat, bw = c.routes
    for s in range(n):
        for t in range(n):
            if s == t:
                continue
            hops = c.route(s, t)
            assert (len(hops), -bw[s, t], lat[s, t]) == _best_route_by_enumeration(c, s, t)
            assert [h[0] for h in hops] == [s, *(h[1] for h in hops[:-1])] and hops[-1][1] == t
            assert min(c.links[h[2]].bandwidth for h in hops) == bw[s, t]
            assert sum(c.links[h[2]].latency_s for h in hops) == lat[s, t]


def test_ports_held_by_each_pair():
    """Each device on a "ports" link has an outgoing port (even id) and an incoming one (the next id); a pair
    holds, on every such link of its route, the sender's outgoing and the receiver's incoming port."""
    devs = [dict(name=n, kind="gpu", peak_flops=1, mem_bandwidth=1, memory_bytes=1, op_overhead_s=0) for n in "abc"]
    tri = from_dict({"name": "tri", "devices": devs,
                     "links": [dict(between=["a", "b", "c"], bandwidth=1.0, latency_s=0.0, sharing="ports")]})
    ptr, port, count = tri.ports
    held = {(x, y): port[ptr[3 * x + y]:ptr[3 * x + y + 1]].tolist() for x in range(3) for y in range(3)}
    assert count == 6
    assert held == {(0, 0): [], (0, 1): [0, 3], (0, 2): [0, 5], (1, 0): [2, 1], (1, 1): [], (1, 2): [2, 5],
                    (2, 0): [4, 1], (2, 1): [4, 3], (2, 2): []}
    # a -(ports)- b -(pairs)- c: a's transfers to c hold a's outgoing and b's incoming port of the first link,
    # and the hop b -> c of the crossbar link (id 4; c -> b: 5), which b's own transfers to c hold too
    line = from_dict({"name": "line", "devices": devs, "links": [
        dict(between=["a", "b"], bandwidth=1.0, latency_s=0.0, sharing="ports"),
        dict(between=["b", "c"], bandwidth=1.0, latency_s=0.0)]})
    ptr, port, count = line.ports
    assert count == 6 and line.route(0, 2) == [(0, 1, 0), (1, 2, 1)] and line.route(2, 0) == [(2, 1, 1), (1, 0, 0)]
    assert port[ptr[2]:ptr[3]].tolist() == [0, 3, 4] and port[ptr[6]:ptr[7]].tolist() == [5, 2, 1]  # a->c, c->a
    assert port[ptr[5]:ptr[6]].tolist() == [4] and port[ptr[7]:ptr[8]].tolist() == [5]  # b->c, c->b
    crossbar = from_dict({"name": "tri", "devices": devs, "links": [dict(between=["a", "b", "c"], bandwidth=1.0,
                                                                         latency_s=0.0)]})
    assert crossbar.ports is None
    # the default sharing leaves the content hash as it was before the field existed; "ports" changes it
    explicit = from_dict({"name": "tri", "devices": devs, "links": [
        dict(between=["a", "b", "c"], bandwidth=1.0, latency_s=0.0, sharing="pairs")]})
    assert explicit.content_hash == crossbar.content_hash != tri.content_hash
    assert crossbar.content_hash == "sha256:" + hashlib.sha256(json.dumps({
        "name": "tri", "devices": [{k: v for k, v in d.__dict__.items() if k != "source"} for d in crossbar.devices],
        "links": [{"between": ["a", "b", "c"], "bandwidth": 1.0, "latency_s": 0.0, "name": ""}]},
        sort_keys=True, default=list).encode()).hexdigest()


GOOD_CLUSTER = {"name": "c", "devices": [
    dict(name=n, kind="gpu", peak_flops=1e9, mem_bandwidth=1e9, memory_bytes=10, op_overhead_s=0) for n in "ab"],
    "links": [dict(between=["a", "b"], bandwidth=1.0, latency_s=0.0)]}


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: d["devices"][0].update(peak_flops=-1.0), "peak_flops: -1.0 must be a finite positive number"),
        (lambda d: d["devices"][0].update(peak_flops=float("nan")), "peak_flops: expected a number"),
        (lambda d: d["devices"][0].update(kind="tpu"), "'tpu' is not one of"),
        (lambda d: d["devices"][1].update(name="a"), "duplicate device name 'a'"),
        (lambda d: d["devices"][0].pop("memory_bytes"), "no field 'memory_bytes'"),
        (lambda d: d["devices"][1].pop("op_overhead_s"), r"devices\[1\] has no field 'op_overhead_s'$"),
        (lambda d: d["links"][0].pop("latency_s"), r"links\[0\] has no field 'latency_s'$"),
        (lambda d: d["devices"][0].update(compute_efficiency=1.5), "must be at most 1"),
        (lambda d: d["links"][0].update(between=["a", "zz"]), "unknown device 'zz'"),
        (lambda d: d.update(links=[]), "no link route from 'a' to 'b'"),
        (lambda d: d.update(devices=[1, 2]), r"devices\[0\] must be a table \(\[\[devices\]\]\), got 1"),
        (lambda d: d.update(links=[1]), r"links\[0\] must be a table \(\[\[links\]\]\), got 1"),
        (lambda d: d.update(links={"between": ["a", "b"]}), r"field 'links' must be an array of tables \(\[\[links\]\]\)"),
        (lambda d: d.update(source="x"), "source: must be a table of field name -> source text, got 'x'"),
        (lambda d: d.update(source={"setup": 5}), r"source\.setup: expected a string, got 5"),
        (lambda d: d["devices"][0].update(source="x"), r"devices\[0\] 'a'\.source: must be a table"),
        (lambda d: d["links"][0].update(source={"bandwidth": 1.0}), r"links\[0\]\.source\.bandwidth: expected a string"),
        (lambda d: d["devices"][0].update(source={"peak_flop": "datasheet"}),
         r"devices\[0\] 'a'\.source\.peak_flop: names no field of a device \(a misspelt field\?\); fields: "),
        (lambda d: d["links"][0].update(source={"bandwith": "datasheet"}),
         r"links\[0\]\.source\.bandwith: names no field of a link"),
        (lambda d: d.update(description=5), "description: expected a string, got 5"),
        (lambda d: d.update(description=10**400), "description: expected a string, got an integer of about 401 digits$"),
        (lambda d: d.update(name=datetime.date(1979, 5, 27)),
         r"field 'name' must be a string, got datetime.date\(1979, 5, 27\)$"),
        (lambda d: d.update(name=""), "field 'name' is missing or empty$"),
        (lambda d: d.update(devices=[10**400]), r"devices\[0\] must be a table \(\[\[devices\]\]\), got an integer of "
                                                "about 401 digits$"),
        (lambda d: d["devices"][0].update(name=10**400), r"devices\[0\]\.name: expected a non-empty string, got an "
                                                         "integer of about 401 digits$"),
        (lambda d: d["devices"][0].update(kind=10**400), "kind: an integer of about 401 digits is not one of"),
        (lambda d: d["links"][0].update(between=["a", 10**400]), r"between: expected device names, got an integer of "
                                                                 "about 401 digits$"),
        (lambda d: d["devices"][0].update(model=5), r"devices\[0\] 'a'\.model: expected a string, got 5"),
        (lambda d: d["links"][0].update(name=["l"]), r"links\[0\]\.name: expected a string"),
        (lambda d: d.update(colour="red", notes=""), r"unknown top-level field\(s\) \['colour', 'notes'\]"),
        (lambda d: d.update(schema_version=True), "schema_version True is not supported"),
        (lambda d: d.update(schema_version=1.0), "schema_version 1.0 is not supported"),
        (lambda d: d["links"][0].update(between=[["a"], "b"]), r"links\[0\]\.between: expected device names, got \['a'\]"),
        (lambda d: d["links"][0].update(between=["a", "a", "b"]), r"links\[0\]\.between: device 'a' is listed twice"),
        (lambda d: d["devices"][0].update(memory_bytes=1.5), r"memory_bytes: expected a whole number of bytes \(an integer\), got 1\.5"),
        (lambda d: d["devices"][0].update(memory_bytes=8e10), "memory_bytes: expected a whole number of bytes"),
        (lambda d: d["devices"][0].update(memory_bytes=1e20), "memory_bytes: expected a whole number of bytes"),
        (lambda d: d["devices"][0].update(memory_bytes=True), "memory_bytes: expected a whole number of bytes"),
        (lambda d: d["devices"][0].update(memory_bytes=2**62 + 1), r"memory_bytes: 4611686018427387905 must be between 1 and 2\*\*62"),
        (lambda d: d["devices"][0].update(memory_bytes=0), r"memory_bytes: 0 must be between 1 and 2\*\*62"),
        (lambda d: d["devices"][0].update(peak_flops=10**400), "peak_flops: .* must be a finite positive number"),
        (lambda d: d["links"][0].update(sharing="bus"), r"links\[0\]\.sharing: 'bus' is not one of pairs, ports"),
        (lambda d: d.update(schema_version=2), r"schema_version 2 is not supported \(expected 1\)"),
        (lambda d: d["links"].append(dict(between=["a"], bandwidth=1.0, latency_s=0.0)),
         r"links\[1\]\.between: a link joins at least two devices, got \['a'\]"),
    ],
)
def test_cluster_errors(mutate, message):
    data = copy.deepcopy(GOOD_CLUSTER)
    mutate(data)
    with pytest.raises(ClusterError, match=message) as err:
        from_dict(data, source="my.toml")
    assert str(err.value).startswith("my.toml: ")


def test_largest_memory_is_accepted():
    devs = [dict(name="a", kind="gpu", peak_flops=1.0, mem_bandwidth=1.0, memory_bytes=2**62, op_overhead_s=0)]
    assert from_dict({"name": "c", "devices": devs}).devices[0].memory_bytes == 2**62


def test_cluster_file_errors(tmp_path):
    (tmp_path / "bad.toml").write_text("name = [unclosed")
    with pytest.raises(ClusterError, match="bad.toml: not valid TOML"):
        load_cluster(str(tmp_path / "bad.toml"))
    (tmp_path / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ClusterError, match=r"latin1.toml: not valid UTF-8 text \(byte 0xe9 at offset 11\)"):
        load_cluster(str(tmp_path / "latin1.toml"))
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(ClusterError, match="dir.toml: cannot read the cluster file: Is a directory"):
        load_cluster(str(tmp_path / "dir.toml"))
    (tmp_path / "table.toml").write_text(
        'name = "c"\n[[devices]]\nname = "a"\nkind = "gpu"\npeak_flops = 1.0\nmem_bandwidth = 1.0\n'
        'memory_bytes = 1\nop_overhead_s = 0.0\n[links]\nname = "x"\n')
    with pytest.raises(ClusterError, match=r"table.toml: field 'links' must be an array of tables \(\[\[links\]\]\)"):
        load_cluster(str(tmp_path / "table.toml"))
    with pytest.raises(UnknownNameError, match="unknown cluster 'nope'"):
        load_cluster("nope")


def small() -> OpGraph:
    return OpGraph.build("small", [
        Op("emb", "embedding", flops=1e9, output_bytes=100, allowed_kinds=("cpu",)),
        Op("fwd", "matmul", flops=2e9, output_bytes=100, group="g"),
        Op("bwd", "matmul", flops=4e9, output_bytes=100, group="g", phase="backward"),
    ], [("emb", "fwd"), ("fwd", "bwd")])


@pytest.mark.parametrize(
    "placement,message",
    [
        ([0, 1], "placement has 2 entries, but workload 'small' has 3 ops"),
        ([0, 1, 7], r"placement\[2\] \(op 'bwd'\): device 7 does not exist"),
        # haswell_2k80 has 3 devices: 3 (the count itself) and -1 are out of range, True is no index
        ([0, 1, 3], r"placement\[2\] \(op 'bwd'\): device 3 does not exist; "
                    r"cluster 'haswell_2k80' has devices 0\.\.2"),
        ([0, 1, -1], r"placement\[2\] \(op 'bwd'\): device -1 does not exist; "
                     r"cluster 'haswell_2k80' has devices 0\.\.2"),
        ([0, True, 1], r"placement\[1\] \(op 'fwd'\): True is not a device index"),
        ([0, "gpu:0", "gpu:9"], "unknown device 'gpu:9'"),
        ([0, 1.5, 1], "1.5 is not a device index"),
        ([1, 1, 1], "op 'emb' is placed on gpu:0 \\(gpu\\), but allows only cpu"),
        ([0, 1, 2], "colocation group 'g' is split: op 'fwd' on gpu:0, op 'bwd' on gpu:1"),
        ({"emb": "cpu:0", "fwd": "gpu:0"}, "no device for 1 op"),
        ({"emb": 0, "fwd": 1, "bwd": 1, "extra": 0}, "op 'extra', which is not in workload"),
    ],
)
def test_placement_errors(placement, message):
    with pytest.raises(PlacementError, match=message):
        validate(placement, small(), load_cluster("haswell_2k80"))


def _reference_violation(p, graph, cluster):
    """The rules of `check_placement` as plain loops: None, ("kind", op), or ("group", group, its first op,
    the first op placed elsewhere than that one)."""
    for i, op in enumerate(graph.ops):
        if op.allowed_kinds and cluster.devices[p[i]].kind not in op.allowed_kinds:
            return "kind", op.name
    for j, op in enumerate(graph.ops):
        first = graph.groups[op.group][0] if op.group else j
        if p[j] != p[first]:
            return "group", op.group, graph.ops[first].name, op.name
    return None


def _draw_ruled_graph(data, max_ops: int) -> OpGraph:
    """A graph of up to max_ops ops, some in colocation groups g1 and g2, some allowing only cpu or gpu, some
    naming both."""
    n = data.draw(st.integers(1, max_ops))
    groups = data.draw(st.lists(st.sampled_from(["", "", "g1", "g2"]), min_size=n, max_size=n))
    kinds = data.draw(st.lists(st.sampled_from([(), (), ("cpu",), ("gpu",), ("gpu", "cpu")]), min_size=n, max_size=n))
    ops = [Op(f"o{i}", "x", flops=1.0, group=groups[i] or None, allowed_kinds=kinds[i]) for i in range(n)]
    try:
        return OpGraph.build("v", ops, [])
    except GraphError:  # a group whose ops allow no common device kind
        assume(False)



def test_an_op_allowing_several_kinds_may_go_on_any_of_them():
    c = load_cluster("haswell_2k80")  # cpu:0, gpu:0, gpu:1
    g = OpGraph.build("kinds", [Op("both", "x", allowed_kinds=("gpu", "cpu")), Op("gpu", "x", allowed_kinds=("gpu",))], [])
    for d in range(3):
        assert validate([d, 1], g, c).tolist() == [d, 1]
    with pytest.raises(PlacementError, match=r"op 'gpu' is placed on cpu:0 \(cpu\), but allows only gpu$"):
        validate([1, 0], g, c)

@settings(max_examples=200, deadline=None)
@given(st.data())
def test_vectorized_validation_equals_the_rules_as_loops(data):
    c = load_cluster("haswell_4k80")  # cpu:0 and four GPUs
    g = _draw_ruled_graph(data, 12)
    n = g.num_ops
    p = np.array(data.draw(st.lists(st.integers(0, c.num_devices - 1), min_size=n, max_size=n)))
    expected = _reference_violation(p, g, c)
    for form in (p, p.tolist(), p.astype(np.int32), p.astype(np.uint8)):
        if expected is None:
            assert validate(form, g, c).tolist() == p.tolist()
        elif expected[0] == "kind":
            with pytest.raises(PlacementError, match=rf"op '{expected[1]}' is placed on .* but allows only"):
                validate(form, g, c)
        else:
            with pytest.raises(PlacementError, match=rf"colocation group '{expected[1]}' is split: op '{expected[2]}' "
                                                     rf"on \S+, op '{expected[3]}' on"):
                validate(form, g, c)


def test_validation_copies_and_names_bad_entries_of_arrays():
    g, c = small(), load_cluster("haswell_2k80")
    mine = np.array([0, 1, 1])
    out = validate(mine, g, c)
    mine[0] = 2
    assert out.tolist() == [0, 1, 1] and not out.flags.writeable
    for bad in (np.array([0, 1, 2**40]), np.array([0, 1, 2**63], dtype=np.uint64), [0, 1, 2**70]):
        with pytest.raises(PlacementError, match=rf"placement\[2\] \(op 'bwd'\): device {bad[2]} does not exist"):
            validate(bad, g, c)
    with pytest.raises(PlacementError, match=r"placement\[0\] \(op 'emb'\): np.False_ is not a device index"):
        validate(np.array([False, True, True]), g, c)
    # a whole-number float is that device (a policy's float output, JSON's 1.0); any other float is not
    assert validate([0, 1.0, np.float64(1)], g, c).tolist() == [0, 1, 1]
    assert validate(np.array([0.0, 1.0, 1.0]), g, c).tolist() == [0, 1, 1]
    with pytest.raises(PlacementError, match=r"placement\[1\] \(op 'fwd'\): 1.5 is not a device index"):
        validate([0, 1.5, 1], g, c)
    with pytest.raises(PlacementError, match=r"placement must be one-dimensional, got shape \(3, 1\)"):
        validate(np.zeros((3, 1), dtype=np.int64), g, c)



def test_a_placement_hash_is_of_its_int64_device_indices_whatever_their_dtype():
    """Result rows record it: it must not change with the dtype a placer returns, nor across versions."""
    assert hashlib.sha256(struct.pack("<3q", 0, 2, 2)).hexdigest()[:16] == "66f9e39629bf76af"
    for p in ([0, 2, 2], np.array([0, 2, 2], dtype=np.int32), np.array([0, 2, 2], dtype=np.uint8)):
        assert placement_hash(p) == "sha256:66f9e39629bf76af"

def test_placement_file_round_trip_and_errors(tmp_path):
    g, c = small(), load_cluster("haswell_2k80")
    p = validate(["cpu:0", "gpu:1", "gpu:1"], g, c)
    assert p.tolist() == [0, 2, 2]
    path = save_placement(p, g, c, tmp_path / "p.json")
    assert load_placement(path, g, c).tolist() == [0, 2, 2]
    data = json.loads(path.read_text())
    assert data == {"format": "placebench.placement", "schema_version": 1, "workload": "small",
                    "workload_hash": g.content_hash, "cluster": "haswell_2k80",
                    "placement": {"emb": "cpu:0", "fwd": "gpu:1", "bwd": "gpu:1"}}
    data["placement"]["emb"] = "gpu:0"
    path.write_text(json.dumps(data))
    with pytest.raises(PlacementError, match="p.json: op 'emb' is placed on gpu:0"):
        load_placement(path, g, c)
    for change, message in (({"workfload": "x"}, r"unknown field\(s\) \['workfload'\]"),
                            ({"schema_version": 2}, "schema_version 2 is not supported"),
                            ({"schema_version": 1.0}, "schema_version 1.0 is not supported")):
        path.write_text(json.dumps({**data, "placement": {"emb": "cpu:0", "fwd": "gpu:1", "bwd": "gpu:1"}, **change}))
        with pytest.raises(PlacementError, match=message):
            load_placement(path, g, c)


def test_profile_overrides_estimate_for_matching_devices(tmp_path):
    g, c = small(), load_cluster("haswell_2k80")
    base = cost_matrix(g, c)
    prof = Profile(workload="small", applies_to="gpu", op_times_s={"fwd": 0.25}, workload_hash=g.content_hash)
    path = prof.save(tmp_path / "p.json")
    cm = cost_matrix(g, c, [load_profile(path)])
    assert cm[1, 1] == 0.25 and cm[1, 2] == 0.25  # both GPUs are of kind "gpu"
    assert cm[1, 0] == base[1, 0] and (cm[[0, 2]] == base[[0, 2]]).all()
    r = simulate(g, c, [0, 1, 1], profiles=[prof])
    assert r.step_time_s == pytest.approx(base[0, 0] + c.transfer_time_s(0, 1, 100) + 0.25 + base[2, 1])


def test_profile_matches_devices_by_model():
    # haswell_2k80: cpu:0 is a Haswell Xeon, gpu:0 and gpu:1 are both "NVIDIA Tesla K80 (one GK210)".
    g, c = small(), load_cluster("haswell_2k80")
    base = cost_matrix(g, c)
    k80 = c.devices[1].model
    assert k80 == "NVIDIA Tesla K80 (one GK210)" and c.devices[2].model == k80 and c.devices[0].model != k80
    cm = cost_matrix(g, c, [Profile(workload="small", applies_to=k80, op_times_s={"bwd": 0.5})])
    assert cm[2, 1] == 0.5 and cm[2, 2] == 0.5  # op bwd on both K80s
    assert cm[2, 0] == base[2, 0] and (cm[[0, 1]] == base[[0, 1]]).all()  # CPU and other ops: estimates
    xeon = c.devices[0].model
    cm = cost_matrix(g, c, [Profile(workload="small", applies_to=xeon, op_times_s={"emb": 0.125})])
    assert cm[0, 0] == 0.125 and (cm[0, 1:] == base[0, 1:]).all() and (cm[1:] == base[1:]).all()


@pytest.mark.parametrize(
    "times,message",
    [({"fwd": -1.0}, "op_times_s\\['fwd'\\] = -1.0"), ({"fwd": float("nan")}, "not a finite"), ({"ghost": 1.0}, "op 'ghost' is not in graph")],
)
def test_profile_errors(tmp_path, times, message):
    g, c = small(), load_cluster("haswell_2k80")
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"format": "placebench.profile", "schema_version": 1, "workload": "small",
                                "applies_to": "gpu", "op_times_s": times}))
    with pytest.raises(ProfileError, match=message):
        cost_matrix(g, c, [load_profile(path)])


PROFILE = {"format": "placebench.profile", "schema_version": 1, "workload": "small", "applies_to": "gpu",
           "op_times_s": {"fwd": 1.0}}


@pytest.mark.parametrize(
    "text,message",
    [
        (json.dumps(PROFILE).replace("1.0", "1" + "0" * 400),
         r"op_times_s\['fwd'\] = an integer of about 401 digits is not a finite"),
        (json.dumps({**PROFILE, "applies_to": 3}), "field 'applies_to' must be a non-empty string, got 3$"),
        (json.dumps({**PROFILE, "workload": ""}), "field 'workload' must be a non-empty string, got ''$"),
        (json.dumps({k: v for k, v in PROFILE.items() if k != "applies_to"}), "field 'applies_to' is missing$"),
        (json.dumps({**PROFILE, "metadata": {"calibration": {"method": "scale", "factor": 0}}}).replace(
            '"factor": 0', '"factor": -1' + "0" * 400), "factor = a negative integer of about 401 digits is not"),
        (json.dumps({**PROFILE, "metadata": "x"}), "field 'metadata' must be an object, got 'x'"),
        (json.dumps({**PROFILE, "metadata": [1]}), r"field 'metadata' must be an object, got \[1\]"),
        (json.dumps({**PROFILE, "workload_hash": 5}), "field 'workload_hash' must be a string, got 5"),
        (json.dumps({**PROFILE, "op_time_s": {}}), r"unknown field\(s\) \['op_time_s'\]"),
        (json.dumps({**PROFILE, "op_times_s": {"fwd": True}}), r"op_times_s\['fwd'\] = True is not a finite"),
        (b'{"workload": "caf\xe9"}', r"not valid UTF-8 text \(byte 0xe9 at offset 17\)"),
        ('{"a": 1' + "0" * 5000 + "}", "not valid JSON: Exceeds the limit"),
        (json.dumps({**PROFILE, "schema_version": 2}), "schema_version 2 is not supported"),
    ],
    ids=["huge-time", "applies-to-number", "workload-empty", "applies-to-missing", "huge-factor", "metadata-string", "metadata-list", "hash-number", "unknown-field", "bool-time", "latin1", "5000-digits",
         "schema-2"],
)
def test_profile_file_errors(tmp_path, text, message):
    path = tmp_path / "p.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ProfileError, match=message) as err:
        load_profile(path)
    assert str(err.value).startswith(f"{path}: ") and len(str(err.value)) < 300


def test_profile_directory_is_refused(tmp_path):
    with pytest.raises(ProfileError, match=f"{tmp_path}: cannot read the profile file: Is a directory"):
        load_profile(tmp_path)


def test_profile_that_applies_to_no_device_is_refused():
    g, c = small(), load_cluster("haswell_2k80")
    with pytest.raises(ProfileError, match=r"profile for 'small' applies to 'tpu', which is no device name, kind or "
                                           r"model of cluster 'haswell_2k80' \(devices cpu:0, gpu:0, gpu:1; kinds cpu, gpu; "
                                           r"models 'Intel"):
        cost_matrix(g, c, [Profile("small", "tpu", {"fwd": 1.0})])


def test_a_profile_read_from_a_file_is_named_in_errors(tmp_path):
    g, c = small(), load_cluster("haswell_2k80")
    path = tmp_path / "small__cpu0.json"
    path.write_text(json.dumps(Profile("small", "cpu", {"fwd": 1.0, "nosuch": 2.0}).to_dict()))
    prof = load_profile(path)
    assert prof.source == str(path) and prof == Profile("small", "cpu", {"fwd": 1.0, "nosuch": 2.0})
    with pytest.raises(ProfileError, match=rf"^{path}: profile for 'small': op 'nosuch' is not in graph 'small'$"):
        cost_matrix(g, c, [prof])


def test_cost_matrix_refuses_a_non_finite_time():
    devs = [dict(name=n, kind=k, peak_flops=5e-324, mem_bandwidth=5e-324, memory_bytes=2**40, op_overhead_s=0)
            for n, k in (("c", "cpu"), ("g", "gpu"))]
    c = from_dict({"name": "slow", "devices": devs, "links": [dict(between=["c", "g"], bandwidth=1.0, latency_s=0.0)]})
    with pytest.raises(ClusterError, match=r"cluster 'slow': op 'emb' of workload 'small' on device 'c' takes inf s"):
        cost_matrix(small(), c)
    with pytest.raises(ClusterError, match="takes inf s"):
        simulate(small(), c, [0, 1, 1])


def test_profile_for_another_graph_is_refused():
    g, c = small(), load_cluster("haswell_2k80")
    with pytest.raises(ProfileError, match="was measured on graph"):
        cost_matrix(g, c, [Profile("small", "gpu", {"fwd": 1.0}, workload_hash="sha256:other")])


def test_cost_matrix_is_read_only_and_roofline():
    g, c = small(), load_cluster("haswell_2k80")
    cm = cost_matrix(g, c)
    cpu = c.devices[0]
    assert cm[1, 0] == pytest.approx(cpu.op_overhead_s + 2e9 / (cpu.peak_flops * cpu.compute_efficiency))
    with pytest.raises(ValueError, match="read-only"):
        cm[0, 0] = 1.0
    assert np.all(cm > 0)


def test_roofline_by_hand_on_every_device():
    """Each column uses its own device's peak, bandwidth, efficiencies and overhead (round numbers)."""
    devs = [dict(name="c", kind="cpu", peak_flops=1e9, compute_efficiency=0.5, mem_bandwidth=1e9, memory_efficiency=0.25,
                 memory_bytes=2**40, op_overhead_s=1e-3),
            dict(name="g", kind="gpu", peak_flops=4e9, compute_efficiency=1.0, mem_bandwidth=2e9, memory_efficiency=0.5,
                 memory_bytes=2**40, op_overhead_s=0.0)]
    c = from_dict({"name": "rf", "devices": devs, "links": [dict(between=["c", "g"], bandwidth=1.0, latency_s=0.0)]})
    g = OpGraph.build("rf", [Op("compute", "matmul", flops=1e9, bytes_read=5e5, bytes_written=5e5),
                             Op("memory", "add", flops=1e3, bytes_read=6e8, bytes_written=4e8)], [("compute", "memory")])
    cm = cost_matrix(g, c)
    # cpu: compute-bound 1e9 / (1e9*0.5) = 2 s vs 1e6 / (1e9*0.25) = 0.004 s; + 1 ms overhead
    assert cm[0, 0] == pytest.approx(2.001)
    # cpu: memory-bound 1e9 B / (1e9*0.25) = 4 s vs 1e3 / 5e8 = 2 us; + 1 ms
    assert cm[1, 0] == pytest.approx(4.001)
    # gpu: 1e9 / 4e9 = 0.25 s vs 1e6 / (2e9*0.5) = 1 ms; memory op 1e9 / 1e9 = 1 s vs 1e3 / 4e9
    assert cm[0, 1] == pytest.approx(0.25) and cm[1, 1] == pytest.approx(1.0)


def test_cost_matrix_refuses_a_negative_time_from_a_profile_made_in_code():
    """A profile file with a negative time is refused when read; one built in code reaches the cost matrix,
    which refuses it too, naming the profile and the op: a negative op time would run the simulator's clock
    backwards."""
    g, c = small(), load_cluster("haswell_2k80")
    for t in (-1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ProfileError, match=rf"profile for 'small': op 'fwd' takes {t!r} s, not a finite"):
            cost_matrix(g, c, [Profile("small", "gpu", {"fwd": t})])
    assert cost_matrix(g, c, [Profile("small", "gpu", {"fwd": 0.0})])[1, 1] == 0.0  # zero is a time


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_batch_is_all_valid_exactly_when_each_placement_validates(data):
    """`all_valid`, the whole-batch check that `simulate_batch` makes first, agrees with `validate` on each
    row, on graphs with device-kind rules and colocation groups and batches with some bad rows."""
    from suite.placement import all_valid

    c = load_cluster("haswell_4k80")
    g = _draw_ruled_graph(data, 10)
    n = g.num_ops
    # rows of device indices, so that the kind and group rules decide; now and then one entry out of range
    rows = data.draw(st.lists(st.lists(st.integers(0, c.num_devices - 1), min_size=n, max_size=n), min_size=1, max_size=4))
    if data.draw(st.integers(0, 4)) == 0:
        rows[data.draw(st.integers(0, len(rows) - 1))][data.draw(st.integers(0, n - 1))] = data.draw(
            st.sampled_from([-1, c.num_devices]))
    batch = np.array(rows)

    def ok(p):
        try:
            validate(p, g, c)
            return True
        except PlacementError:
            return False

    assert all_valid(batch, g, c) == all(ok(p) for p in batch)
    assert all_valid(batch.astype(np.uint8) if batch.min() >= 0 else batch, g, c) == all(ok(p) for p in batch)
    assert not all_valid(batch.astype(float), g, c)  # not integers: validate looks at each entry


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_random_placements_keep_the_rules_of_every_op_of_a_group(data):
    """A colocation group goes to a device every one of its ops allows, not only its first op: on graphs
    with device-kind rules and groups (e.g. a free first op and a cpu-only one in g1), every draw validates."""
    from suite.placement import random_placements

    c = load_cluster("haswell_4k80")
    g = _draw_ruled_graph(data, 10)
    for p in random_placements(g, c, np.random.default_rng(data.draw(st.integers(0, 2**32 - 1))), 16):
        validate(p, g, c)


def test_a_group_that_only_a_later_op_rules_out_of_a_cluster_cannot_be_placed(uniform_cluster):
    """A group of a free op and a cpu-only op has no device on a cluster of GPUs, though its first op has."""
    from suite.placement import check_placeable, random_placements

    g = OpGraph.build("g", [Op("a", "x", flops=1.0, group="g"), Op("b", "x", flops=1.0, group="g", allowed_kinds=("cpu",)),
                            Op("c", "x", flops=1.0)], [])
    c = load_cluster("haswell_4k80")
    assert (random_placements(g, c, np.random.default_rng(0), 32)[:, :2] == 0).all()  # cpu:0 is device 0
    with pytest.raises(PlacementError, match=r"'g' cannot be placed on 'uniform2': op 'a' \(or its colocation group\) "
                                             r"allows none of its device kinds \(gpu\)"):
        check_placeable(g, uniform_cluster(2))


def test_clusters_built_in_python_are_checked_like_files():
    """The constructor checks what from_dict checks: a name, and `between` as a list of device names (a
    string "ab" would otherwise be read as the devices 'a' and 'b')."""
    from suite.cluster import Cluster, Device, Link

    devs = (Device("a", "gpu", 1.0, 1.0, 1, 0.0), Device("b", "gpu", 1.0, 1.0, 1, 0.0))
    for name in (None, "", 5):
        with pytest.raises(ClusterError, match=f"cluster name: expected a non-empty string, got {name!r}"):
            Cluster(name, devs[:1], ())
    with pytest.raises(ClusterError, match=r"links\[0\]\.between: expected a list of device names, got 'ab'"):
        Cluster("c", devs, (Link("ab", 1.0, 0.0),))


def test_a_cluster_hash_does_not_depend_on_how_a_number_is_written():
    """-0.0 s is the same latency as 0.0: the same hash; a numpy integer of memory is an integer (no
    TypeError from json). (peak_flops = 1 and 1.0 still hash apart: changing that would move the hashes
    of existing cluster files that write integers.)"""
    from suite.cluster import Cluster, Device, Link

    def make(flops, latency, memory):
        devs = (Device("a", "gpu", flops, 1.0, memory, 0.0), Device("b", "gpu", 1.0, 1.0, 1, 0.0))
        return Cluster("c", devs, (Link(("a", "b"), 1.0, latency),))

    assert make(1.0, -0.0, np.int64(1)).content_hash == make(1.0, 0.0, 1).content_hash
    assert make(2.0, 0.0, 1).content_hash != make(1.0, 0.0, 1).content_hash


def test_numpy_numbers_in_any_field_hash_as_the_python_numbers():
    """A cluster built from numpy numbers (np.float32 FLOP/s, an np.int64 bandwidth) has the hash of the same
    Python numbers, not a TypeError from json."""
    from suite.cluster import Cluster, Device, Link

    def make(flops, bandwidth, latency):
        devs = (Device("a", "gpu", flops, bandwidth, 1, 0.0), Device("b", "gpu", 1.0, 1.0, 1, 0.0))
        return Cluster("c", devs, (Link(("a", "b"), bandwidth, latency),))

    assert make(np.float32(0.5), np.int64(3), np.float32(0.25)).content_hash == make(0.5, 3, 0.25).content_hash
