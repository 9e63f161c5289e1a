"""cudagym.kernelbench: the KernelBench problem source (file, env var, Hugging Face dataset)."""

from __future__ import annotations

import json

import pytest

from cudagym import kernelbench
from cudagym.tasks import Task, TaskError, read_rows, sha256_text


@pytest.fixture
def rows(kernelbench_path):
    return read_rows(kernelbench_path)


@pytest.fixture
def no_hub_cache():
    kernelbench._hub_catalog.cache_clear()
    yield
    kernelbench._hub_catalog.cache_clear()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_v01_levels_1_to_3_has_250_problems(kernelbench_path):
    tasks = kernelbench.load_problems("v0.1", levels=(1, 2, 3), path=kernelbench_path)
    assert len(tasks) == 250
    per_level = {lvl: sum(t.level == lvl for t in tasks) for lvl in (1, 2, 3)}
    assert per_level == {1: 100, 2: 100, 3: 50}
    assert [(t.level, t.problem_id) for t in tasks] == sorted((t.level, t.problem_id) for t in tasks)
    assert {t.problem_id for t in tasks if t.level == 1} == set(range(1, 101))
    assert {t.problem_id for t in tasks if t.level == 3} == set(range(1, 51))


def test_defaults_are_v01_levels_1_to_3(kernelbench_path):
    assert kernelbench.load_problems(path=kernelbench_path) == kernelbench.load_problems(
        "v0.1", levels=(1, 2, 3), path=kernelbench_path)


def test_ids_names_and_source(kernelbench_path):
    task = kernelbench.get_problem("v0.1", 1, 12, path=kernelbench_path)
    assert task.id == "v0.1/L1/12"
    assert task.name == "12_Matmul_with_diagonal_matrices_"
    assert (task.level, task.problem_id) == (1, 12)
    assert task.source == "kernelbench:v0.1"
    assert task.kb_version == "v0.1"
    assert "class Model(nn.Module)" in task.code and "def get_inputs" in task.code
    assert task.provenance.get("commit")
    assert kernelbench.get_problem("v0.1", 3, 50, path=kernelbench_path).name == "50_ReLUSelfAttention"
    assert kernelbench.get_problem("v0.1", 2, 1, path=kernelbench_path).id == "v0.1/L2/1"


def test_every_task_is_a_kernelbench_module(kernelbench_path):
    for task in kernelbench.load_problems("v0.1", levels=(1, 2, 3, 4), path=kernelbench_path):
        assert task.name.startswith(f"{task.problem_id}_"), task.id
        for needle in ("class Model", "def get_inputs", "def get_init_inputs"):
            assert needle in task.code, (task.id, needle)


def test_level_4_and_level_string(kernelbench_path):
    assert len(kernelbench.load_problems("v0.1", levels=4, path=kernelbench_path)) == 20
    assert kernelbench.load_problems("v0.1", levels="1,3", path=kernelbench_path) == \
        kernelbench.load_problems("v0.1", levels=[3, 1], path=kernelbench_path)


def test_versions(kernelbench_path):
    assert kernelbench.available_versions(kernelbench_path) == ["latest", "v0", "v0.1"]
    for version in ("v0", "v0.1", "latest"):
        tasks = kernelbench.load_problems(version, path=kernelbench_path)
        assert len(tasks) == 250
        assert all(t.source == f"kernelbench:{version}" and t.id.startswith(f"{version}/") for t in tasks)


def test_versions_differ(kernelbench_path):
    # v0.1 changed inputs of level 1 problem 12 from randn to rand (diag matmul), and replaced
    # level 1 problem 50 by a different problem.
    v0 = kernelbench.get_problem("v0", 1, 12, path=kernelbench_path)
    v01 = kernelbench.get_problem("v0.1", 1, 12, path=kernelbench_path)
    assert v0.name == v01.name
    assert v0.code != v01.code and v0.sha256 != v01.sha256
    assert "torch.randn(N)" in v0.code and "torch.rand(N)" in v01.code
    assert kernelbench.get_problem("v0", 1, 50, path=kernelbench_path).name != \
        kernelbench.get_problem("v0.1", 1, 50, path=kernelbench_path).name


def test_sha256_column_is_verified(kernelbench_path, rows):
    assert all(r["sha256"] == sha256_text(r["code"]) for r in rows)
    by_id = {t.id: t for t in kernelbench.load_problems("v0.1", levels=(1, 2, 3, 4), path=kernelbench_path)}
    for r in rows:
        if r["version"] == "v0.1":
            assert by_id[f"v0.1/L{r['level']}/{r['problem_id']}"].sha256 == r["sha256"]


def test_tampered_sha256_raises(tmp_path, rows):
    tampered = [dict(r) for r in rows if r["version"] == "v0.1" and r["level"] == 1][:5]
    tampered[3]["code"] += "\n# edited\n"
    path = write_jsonl(tmp_path / "tampered.jsonl", tampered)
    with pytest.raises(TaskError, match=r"sha256 mismatch") as e:
        kernelbench.load_problems("v0.1", levels=1, path=path)
    assert f"v0.1/L1/{tampered[3]['problem_id']}" in str(e.value)
    assert "\n" not in str(e.value)


def test_rows_without_sha256_load(tmp_path, rows):
    plain = [{k: v for k, v in r.items() if k != "sha256"} for r in rows if r["version"] == "v0"][:3]
    path = write_jsonl(tmp_path / "plain.jsonl", plain)
    assert len(kernelbench.load_problems("v0", levels=(1, 2, 3, 4), path=path)) == 3


def test_parquet_and_jsonl_give_the_same_tasks(tmp_path, kernelbench_path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "problems.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for version in ("v0", "v0.1", "latest"):
        from_jsonl = kernelbench.load_problems(version, levels=(1, 2, 3, 4), path=kernelbench_path)
        from_parquet = kernelbench.load_problems(version, levels=(1, 2, 3, 4), path=parquet)
        assert from_parquet == from_jsonl
        assert [t.sha256 for t in from_parquet] == [t.sha256 for t in from_jsonl]


def test_env_var_is_the_default_source(monkeypatch, tmp_path, rows):
    subset = [r for r in rows if r["version"] == "v0.1" and r["level"] == 2][:4]
    monkeypatch.setenv(kernelbench.ENV_VAR, str(write_jsonl(tmp_path / "kb.jsonl", subset)))
    tasks = kernelbench.load_problems(levels=2)
    assert [t.problem_id for t in tasks] == sorted(r["problem_id"] for r in subset)
    # an explicit path wins over the env var
    other = write_jsonl(tmp_path / "other.jsonl", subset[:1])
    assert len(kernelbench.load_problems(levels=2, path=other)) == 1


def test_env_var_pointing_nowhere(monkeypatch, tmp_path):
    monkeypatch.setenv(kernelbench.ENV_VAR, str(tmp_path / "missing.jsonl"))
    with pytest.raises(TaskError, match=r"CUDAGYM_KERNELBENCH"):
        kernelbench.load_problems()


def test_cache_rereads_a_changed_file(tmp_path, rows):
    v01 = [r for r in rows if r["version"] == "v0.1"]
    path = write_jsonl(tmp_path / "kb.jsonl", v01[:2])
    assert len(kernelbench.load_problems("v0.1", levels=(1, 2, 3, 4), path=path)) == 2
    write_jsonl(path, v01[:7])
    assert len(kernelbench.load_problems("v0.1", levels=(1, 2, 3, 4), path=path)) == 7


def test_unknown_version_lists_available(kernelbench_path):
    with pytest.raises(TaskError) as e:
        kernelbench.load_problems("v9", path=kernelbench_path)
    message = str(e.value)
    assert "unknown KernelBench version 'v9'" in message
    assert all(v in message for v in ("v0", "v0.1", "latest"))
    assert "\n" not in message


def test_no_problems_at_levels(kernelbench_path):
    with pytest.raises(TaskError, match=r"no KernelBench problems at version v0.1 levels \[7\].*available: .*v0.1"):
        kernelbench.load_problems("v0.1", levels=(7,), path=kernelbench_path)
    with pytest.raises(TaskError, match=r"levels must be integers"):
        kernelbench.load_problems("v0.1", levels="one", path=kernelbench_path)


def test_unknown_problem(kernelbench_path):
    with pytest.raises(TaskError, match=r"unknown problem: KernelBench v0.1 level 1 problem 101 \(level 1 has problem ids 1-100\)"):
        kernelbench.get_problem("v0.1", 1, 101, path=kernelbench_path)
    with pytest.raises(TaskError, match=r"unknown problem: .* level 9 problem 1"):
        kernelbench.get_problem("v0.1", 9, 1, path=kernelbench_path)
    with pytest.raises(TaskError, match=r"unknown KernelBench version 'v7'"):
        kernelbench.get_problem("v7", 1, 1, path=kernelbench_path)


def test_duplicate_problem_raises(tmp_path, rows):
    row = next(r for r in rows if r["version"] == "v0.1")
    with pytest.raises(TaskError, match=r"appears twice"):
        kernelbench.load_problems("v0.1", levels=row["level"], path=write_jsonl(tmp_path / "dup.jsonl", [row, row]))


def test_missing_version_column(tmp_path, rows):
    row = {k: v for k, v in rows[0].items() if k != "version"}
    with pytest.raises(TaskError, match=r"lacks column 'version'"):
        kernelbench.load_problems(path=write_jsonl(tmp_path / "nover.jsonl", [row]))


def test_hub_dataset_maps_to_latest(monkeypatch, rows, no_hub_cache):
    datasets = pytest.importorskip("datasets")
    latest = [r for r in rows if r["version"] == "latest"]
    splits = datasets.DatasetDict({
        f"level_{lvl}": datasets.Dataset.from_list(
            [{"code": r["code"], "level": r["level"], "name": r["name"], "problem_id": r["problem_id"]}
             for r in latest if r["level"] == lvl])
        for lvl in (1, 2, 3, 4)})
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, *a, **kw: calls.append(name) or splits)
    monkeypatch.delenv(kernelbench.ENV_VAR, raising=False)

    tasks = kernelbench.load_problems("latest")
    assert calls == [kernelbench.HF_DATASET]
    assert len(tasks) == 250
    assert tasks[0] == Task(id="latest/L1/1", name=latest_name(rows, 1, 1), code=tasks[0].code, level=1,
                            problem_id=1, source="kernelbench:latest")
    assert {t.sha256 for t in tasks} == {r["sha256"] for r in latest if r["level"] <= 3}
    assert kernelbench.available_versions() == ["latest"]
    with pytest.raises(TaskError, match=r"unknown KernelBench version 'v0.1'; available: latest"):
        kernelbench.load_problems()
    kernelbench.load_problems("latest")
    assert calls == [kernelbench.HF_DATASET]  # loaded once per process


def latest_name(rows, level, problem_id):
    return next(r["name"] for r in rows if (r["version"], r["level"], r["problem_id"]) == ("latest", level, problem_id))


def test_offline_without_file_says_to_set_the_env_var(monkeypatch, no_hub_cache):
    datasets = pytest.importorskip("datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach the Hugging Face Hub (offline mode is enabled)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv(kernelbench.ENV_VAR, raising=False)
    with pytest.raises(TaskError) as e:
        kernelbench.load_problems()
    message = str(e.value)
    assert "set CUDAGYM_KERNELBENCH" in message and "\n" not in message
