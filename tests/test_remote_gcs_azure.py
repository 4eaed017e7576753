"""Google Cloud Storage (``gs://``) and Azure Blob Storage (``az://``,
``abfs://``) against real emulators started by the session fixtures
(fake-gcs-server and Azurite, ``tests/emulators.py``): the read tests the
S3 suite has for a model (safetensors bit for bit against the safetensors
library, a sharded index, an object replaced mid-read refused), writes
(save_file and convert to a URL, read back and compared with a local
write), prefixes (a sharded checkpoint and a DCP directory opened by their
prefix), and the credentials and endpoints each backend's users set.

Objects are put and inspected with each emulator's own REST API
(``emulators.py``), never through zt.

Writes run against Azurite only: object_store's GCS client uploads by the
XML API (PUT Object, XML multipart uploads), which fake-gcs-server does not
implement (it takes uploads by its JSON API and signed URLs); GCS prefixes
are tested with the same files written locally and put by the JSON API.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
from dataclasses import dataclass

import numpy as np
import pytest
import safetensors.numpy

import zt

RNG = np.random.default_rng(20261206)


@dataclass
class Cloud:
    """One bucket (GCS) or container (Azure) of an emulator."""

    scheme: str
    server: object
    root: str

    def url(self, key: str = "") -> str:
        return f"{self.scheme}://{self.root}/{key}"

    def upload(self, local: pathlib.Path, key: str | None = None) -> str:
        key = key or local.name
        self.server.put(self.root, key, local.read_bytes())
        return self.url(key)

    def get(self, key: str) -> bytes:
        return self.server.get(self.root, key)

    def keys(self, prefix: str = "") -> list[str]:
        return self.server.keys(self.root, prefix)

    @property
    def writable(self) -> bool:
        """Whether zt can upload to this emulator (see the module's docs)."""
        return self.scheme == "az"

    def write(self, key: str, tmp: pathlib.Path, write, local: bool = False) -> None:
        """``write(dest)`` to the URL of ``key``; where zt cannot upload to
        the emulator (or ``local``), to a local directory whose files are
        then put."""
        if self.writable and not local:
            write(self.url(key))
            return
        target = tmp / "written" / key
        target.parent.mkdir(parents=True)
        write(target)
        for f in sorted(target.parent.rglob("*")):
            if f.is_file():
                self.upload(f, f"{os.path.dirname(key)}/{f.relative_to(target.parent)}".lstrip("/"))


@pytest.fixture
def azure_cloud(azure, azure_container) -> Cloud:
    return Cloud("az", azure, azure_container)


@pytest.fixture(params=["gs", "az"])
def cloud(request) -> Cloud:
    if request.param == "gs":
        return Cloud("gs", request.getfixturevalue("gcs"), request.getfixturevalue("gcs_bucket"))
    return Cloud("az", request.getfixturevalue("azure"), request.getfixturevalue("azure_container"))


def model(tmp: pathlib.Path, name: str = "model.safetensors") -> tuple[pathlib.Path, dict[str, np.ndarray]]:
    """A small safetensors model, written by the safetensors library: 2 MiB,
    so its middle lies past the head and tail an open fetches."""
    arrays = {
        "embed": RNG.standard_normal((512, 1024)).astype(np.float32),
        "bias": RNG.integers(-9, 9, size=7).astype(np.int64),
        "half": RNG.standard_normal((3, 5)).astype(np.float16),
    }
    path = tmp / name
    safetensors.numpy.save_file(arrays, os.fspath(path), metadata={"format": "np"})
    return path, arrays


# ------------------------------------------------ reads


def test_safetensors_reads_back_bit_for_bit(cloud, tmp):
    path, arrays = model(tmp)
    url = cloud.upload(path, "models/m1/model.safetensors")
    want = safetensors.numpy.load_file(os.fspath(path))
    got = zt.numpy.load_file(url)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].tobytes() == want[name].tobytes(), name
    with zt.open(url) as src, zt.open(path) as local:
        assert src.format == "safetensors" and src.files == [url]
        assert src.attributes == local.attributes
        t = src["embed"]
        assert not t.caps["map"] and t.caps["remote"] and t.location[0] == url
        assert t.numpy().tobytes() == want["embed"].tobytes()
    with zt.safe_open(url, "numpy") as f:
        assert sorted(f.keys()) == sorted(want)
        assert f.get_tensor("half").tobytes() == want["half"].tobytes()
        assert f.get_slice("embed")[3:5].tobytes() == want["embed"][3:5].tobytes()


def test_abfs_is_az_as_fsspec_spells_it(azure, azure_container, tmp):
    path, arrays = model(tmp)
    azure.put(azure_container, "m.safetensors", path.read_bytes())
    got = zt.numpy.load_file(f"abfs://{azure_container}/m.safetensors")
    assert got["embed"].tobytes() == arrays["embed"].tobytes()
    with zt.open(f"abfss://{azure_container}/m.safetensors") as src:
        assert src.files == [f"abfss://{azure_container}/m.safetensors"]


def test_sharded_index_under_one_prefix(cloud, tmp):
    a = {"a": RNG.standard_normal((10, 10)).astype(np.float32)}
    b = {"b": np.arange(5, dtype=np.int32), "c": np.ones(3, np.float16)}
    safetensors.numpy.save_file(a, os.fspath(tmp / "model-00001-of-00002.safetensors"))
    safetensors.numpy.save_file(b, os.fspath(tmp / "model-00002-of-00002.safetensors"))
    weight_map = {"a": "model-00001-of-00002.safetensors"} | {k: "model-00002-of-00002.safetensors" for k in b}
    total = sum(x.nbytes for x in (*a.values(), *b.values()))
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    for f in sorted(tmp.iterdir()):
        cloud.upload(f, f"ckpt/{f.name}")
    for url in (cloud.url("ckpt/model.safetensors.index.json"), cloud.url("ckpt/")):
        with zt.open(url) as src:
            assert sorted(src) == ["a", "b", "c"], url
            assert src.attributes["metadata"]["total_size"] == total
            for name, want in {**a, **b}.items():
                assert src[name].numpy().tobytes() == want.tobytes(), (url, name)


def test_an_object_replaced_during_a_read_fails_cleanly(cloud, tmp):
    path, arrays = model(tmp, "v1.safetensors")
    url = cloud.upload(path, "m.safetensors")
    src = zt.open(url)
    safetensors.numpy.save_file({k: v + 1 for k, v in arrays.items()}, os.fspath(tmp / "v2.safetensors"))
    cloud.upload(tmp / "v2.safetensors", "m.safetensors")
    with pytest.raises(zt.FormatError, match="changed"):
        src["embed"].numpy()
    src.close()
    with zt.open(url) as fresh:
        assert fresh["embed"].numpy().tobytes() == (arrays["embed"] + 1).tobytes()


def test_missing_objects_are_file_not_found(cloud):
    with pytest.raises(FileNotFoundError):
        zt.open(cloud.url("no/such.safetensors"))


# ------------------------------------------------ writes


def test_save_and_convert_to_the_url_read_back(azure_cloud, tmp):
    cloud = azure_cloud
    arrays = {"w": RNG.standard_normal((300, 300)).astype(np.float32), "step": np.array(7)}
    for ext in ["safetensors", "zt"]:
        url = cloud.url(f"save/m.{ext}")
        zt.numpy.save_file(arrays, url)
        got = zt.numpy.load_file(url)
        assert got["w"].tobytes() == arrays["w"].tobytes() and int(got["step"]) == 7, ext
    # URL -> URL, byte for byte a local conversion's.
    zt.convert(cloud.url("save/m.safetensors"), cloud.url("conv/m.zt"))
    zt.convert(cloud.url("save/m.safetensors"), tmp / "local.zt")
    assert cloud.get("conv/m.zt") == (tmp / "local.zt").read_bytes()
    # The safetensors written equals the safetensors library's reading.
    (tmp / "back.safetensors").write_bytes(cloud.get("save/m.safetensors"))
    back = safetensors.numpy.load_file(os.fspath(tmp / "back.safetensors"))
    assert back["w"].tobytes() == arrays["w"].tobytes()
    assert cloud.keys("save/") == ["save/m.safetensors", "save/m.zt"]


def test_part_sizes_each_backend_takes(cloud, tmp):
    """GCS's XML multipart upload, as S3's, refuses parts under 5 MiB (the
    last excepted) only at completion: a write to gs:// with smaller parts
    is refused before a request. Azure's blocks have no minimum: 64 KiB
    parts upload a 1.2 MB file as 19 blocks, read back bit for bit."""
    arrays = {"w": RNG.standard_normal((300, 1000)).astype(np.float32)}
    options = {"part_size": 64 << 10}
    if cloud.scheme == "gs":
        with pytest.raises(ValueError, match="below the 5 MiB"):
            zt.numpy.save_file(arrays, cloud.url("parts/m.safetensors"), storage_options=options)
        assert cloud.keys("parts/") == []
        return
    zt.numpy.save_file(arrays, cloud.url("parts/m.safetensors"), storage_options=options)
    (tmp / "back.safetensors").write_bytes(cloud.get("parts/m.safetensors"))
    back = safetensors.numpy.load_file(os.fspath(tmp / "back.safetensors"))
    assert back["w"].tobytes() == arrays["w"].tobytes()


def test_an_exception_while_writing_uploads_nothing(cloud):
    with pytest.raises(RuntimeError), zt.Writer(cloud.url("x/never.zt")) as w:
        w.add("a", np.ones(4, np.float32))
        raise RuntimeError("stop")
    assert cloud.keys("x/") == []


# ------------------------------------------------ prefixes


def test_sharded_write_reads_back_through_its_prefix(cloud, tmp):
    tensors = {f"layers.{i}.weight": RNG.standard_normal((64, 64)).astype(np.float32) for i in range(6)}
    cloud.write("np/model.safetensors", tmp, lambda dest: zt.numpy.save_file(tensors, dest, max_shard_size="40KB"))
    assert cloud.keys("np/") == [f"np/model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)] + [
        "np/model.safetensors.index.json"
    ]
    with zt.open(cloud.url("np/")) as src:
        assert sorted(src) == sorted(tensors)
        for name, want in tensors.items():
            assert src[name].numpy().tobytes() == want.tobytes(), name


def test_a_dcp_directory_under_a_prefix_reads_back(cloud, tmp):
    # zt writes DCP directories locally only (for S3 too): written here,
    # put, and read through the prefix.
    path, arrays = model(tmp)
    cloud.write("dcp", tmp, lambda dest: zt.convert(path, dest, format="dcp", dcp_files=2), local=True)
    keys = cloud.keys("dcp/")
    assert "dcp/.metadata" in keys and sum(k.endswith(".distcp") for k in keys) == 2, keys
    got = zt.numpy.load_file(cloud.url("dcp/"))
    for name, want in arrays.items():
        assert got[name].tobytes() == want.tobytes(), name


# ------------------------------------------------ credentials and endpoints


def test_gcs_endpoint_as_an_option_needs_no_environment(gcs, gcs_bucket, tmp, monkeypatch):
    path, arrays = model(tmp)
    gcs.put(gcs_bucket, "m.safetensors", path.read_bytes())
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    options = {"endpoint": gcs.endpoint, "skip_signature": "true"}
    got = zt.numpy.load_file(f"gs://{gcs_bucket}/m.safetensors", storage_options=options)
    assert got["bias"].tobytes() == arrays["bias"].tobytes()


def test_google_application_credentials_is_read(gcs, gcs_bucket, tmp, monkeypatch):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", os.fspath(tmp / "missing.json"))
    with pytest.raises(ValueError, match="missing.json"):
        zt.open(f"gs://{gcs_bucket}/m.safetensors")


def test_options_of_another_backend_are_refused(cloud):
    with pytest.raises(ValueError, match="unknown storage option"):
        zt.open(cloud.url("m.safetensors"), storage_options={"region": "us-east-1"})
    with pytest.raises(ValueError, match="storage option"):
        zt.open(cloud.url("m.safetensors"), storage_options={"no_such_option": "1"})


def test_azure_connection_strings_and_the_emulator_switch(azure, azure_container, tmp, monkeypatch):
    import emulators

    path, arrays = model(tmp)
    azure.put(azure_container, "m.safetensors", path.read_bytes())
    for var in azure.env:
        monkeypatch.delenv(var)
    url = f"az://{azure_container}/m.safetensors"
    # The connection string Azurite documents, as an option ...
    got = zt.numpy.load_file(url, storage_options={"connection_string": azure.connection_string})
    assert got["embed"].tobytes() == arrays["embed"].tobytes()
    # ... and from the environment (a fresh container: stores are cached
    # per container and options).
    others = [f"{azure_container[:50]}-{i}" for i in range(2)]
    for name in others:
        azure.create_container(name)
        azure.put(name, "m.safetensors", path.read_bytes())
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure.connection_string)
    assert zt.numpy.load_file(f"az://{others[0]}/m.safetensors")["bias"].tobytes() == arrays["bias"].tobytes()
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING")
    # AZURE_STORAGE_USE_EMULATOR: the development account at
    # AZURITE_BLOB_STORAGE_URL, with no name or key given.
    monkeypatch.setenv("AZURE_STORAGE_USE_EMULATOR", "true")
    monkeypatch.setenv("AZURITE_BLOB_STORAGE_URL", f"http://127.0.0.1:{azure.port}")
    assert zt.numpy.load_file(f"az://{others[1]}/m.safetensors")["half"].tobytes() == arrays["half"].tobytes()
    assert emulators.AZURE_ACCOUNT in azure.endpoint


def test_a_wrong_azure_key_is_permission_error(azure, azure_container, tmp):
    path, _ = model(tmp)
    azure.put(azure_container, "m.safetensors", path.read_bytes())
    wrong = base64.b64encode(b"not the key" * 6).decode()
    with pytest.raises(PermissionError):
        zt.open(
            f"az://{azure_container}/m.safetensors",
            storage_options={"account_key": wrong, "max_retries": 0},
        )


# ------------------------------------------------ the CLI


def test_the_cli_reaches_each_backend_by_its_environment_or_endpoint(cloud, tmp, zt_cli):
    """`zt` reads gs:// and az:// with the variables their users set, and
    `--endpoint` points it at the server whatever those variables say:
    GCS's emulator address or base URL, Azure's endpoint or the
    connection string's BlobEndpoint. Writes (Azure only, see the module
    docs) go up through the CLI too."""
    import subprocess

    path, _ = model(tmp)
    url = cloud.upload(path, "cli/model.safetensors")
    server = cloud.server.endpoint
    dead = "http://127.0.0.1:1" + ("/devstoreaccount1" if cloud.scheme == "az" else "")

    def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([zt_cli, *args], capture_output=True, text=True, env=env)

    def reads(env: dict[str, str], *endpoint: str) -> None:
        out = run(env, "ls", *endpoint, url)
        assert out.returncode == 0 and "embed" in out.stdout, out.stderr
        assert run(env, "detect", *endpoint, url).stdout.strip() == "safetensors"
        diff = run(env, "diff", *endpoint, os.fspath(path), url)
        assert diff.returncode == 0, diff.stdout + diff.stderr

    users = dict(os.environ)  # the fixtures' variables: the emulator as its users set it
    reads(users)
    if cloud.scheme == "gs":
        reads({**users, "STORAGE_EMULATOR_HOST": dead}, "--endpoint", server)
        public = {k: v for k, v in users.items() if k != "STORAGE_EMULATOR_HOST"}
        reads({**public, "GOOGLE_SKIP_SIGNATURE": "true"}, "--endpoint", server)
        return
    reads({**users, "AZURE_STORAGE_ENDPOINT": dead}, "--endpoint", server)
    connection = cloud.server.connection_string.replace(server, dead)
    plain = {k: v for k, v in users.items() if not k.startswith("AZURE_")}
    reads({**plain, "AZURE_STORAGE_CONNECTION_STRING": connection}, "--endpoint", server)
    dest = cloud.url("cli/model.zt")
    env = {**users, "AZURE_STORAGE_ENDPOINT": dead}
    assert run(env, "convert", "--endpoint", server, os.fspath(path), dest).returncode == 0
    assert run(env, "verify", "--endpoint", server, dest).returncode == 0
    assert run(env, "diff", "--endpoint", server, url, dest).returncode == 0
    assert "cli/model.zt" in cloud.keys("cli/")
