"""What the upload-fault tests share (zrecord stores and checkpoints
failing mid-upload, ``test_zrecord_upload_faults.py`` and
``test_checkpoint_upload_faults.py``): a bucket or container seen through
its server's own API, and ``decide`` functions for the suite's fault proxy
(``faultproxy.py``) failing a PUT, a multipart part, or every delete."""

from __future__ import annotations

import itertools
import threading
import urllib.parse
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from faultproxy import FaultProxy


@dataclass
class Backend:
    """A bucket (S3) or container (Azure) seen through the server's own API."""

    scheme: str
    upstream: str  # the endpoint zt is given without a proxy
    root: str
    server: object

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.root}/{key}"

    def endpoint(self, proxy: FaultProxy | None) -> str:
        if proxy is None:
            return self.upstream
        # Azurite's blob endpoint is path style: the account is in it.
        return proxy.endpoint + ("/" + self.upstream.rsplit("/", 1)[1] if self.scheme == "az" else "")

    def proxy(self, decide) -> FaultProxy:
        return FaultProxy("/".join(self.upstream.split("/")[:3]), decide)

    def keys(self, prefix: str) -> list[str]:
        if self.scheme == "az":
            return self.server.keys(self.root, prefix)
        listed = self.server.boto3().list_objects_v2(Bucket=self.root, Prefix=prefix)
        return sorted(o["Key"] for o in listed.get("Contents", []))

    def put(self, key: str, data: bytes) -> None:
        if self.scheme == "az":
            self.server.put(self.root, key, data)
        else:
            self.server.boto3().put_object(Bucket=self.root, Key=key, Body=data)

    def delete(self, key: str) -> None:
        if self.scheme == "az":
            self.server._call("DELETE", f"{self.root}/{key}")
        else:
            self.server.boto3().delete_object(Bucket=self.root, Key=key)

    def get(self, key: str) -> bytes:
        if self.scheme == "az":
            return self.server.get(self.root, key)
        return self.server.boto3().get_object(Bucket=self.root, Key=key)["Body"].read()

    def open_uploads(self) -> list[str]:
        """S3: the keys of open multipart uploads. Azure: the blobs holding
        only uncommitted blocks."""
        if self.scheme == "az":
            xml = self.server._call(
                "GET", self.root, {"restype": "container", "comp": "list", "include": "uncommittedblobs"}
            )
            committed = set(self.keys(""))
            return sorted(e.text for e in ET.fromstring(xml).iter("Name") if e.text not in committed)
        uploads = self.server.boto3().list_multipart_uploads(Bucket=self.root).get("Uploads", [])
        return [u["Key"] for u in uploads]


def put_of(name: str, part: int | None = None):
    """A proxy ``decide`` failing (500) the PUT of the store's object
    ``name``, or only its multipart part ``part`` (S3: that part number;
    Azure, whose block ids are random: the ``part``-th block sent)."""
    blocks = itertools.count(1)
    lock = threading.Lock()

    def decide(request):
        split = urllib.parse.urlsplit(request.path)
        if request.method != "PUT" or not split.path.endswith("/" + name):
            return None
        query = urllib.parse.parse_qs(split.query)
        if part is None:
            return "500"
        if query.get("comp") == ["block"]:
            with lock:
                return "500" if next(blocks) == part else None
        return "500" if query.get("partNumber") == [str(part)] else None

    return decide


def deletes_fail(fail_put):
    """A ``decide`` failing every delete (the server gone for them) and
    what ``fail_put`` fails."""

    def decide(request):
        # object_store deletes by DeleteObjects on S3 (POST ?delete), by a
        # blob batch on Azure (POST ?restype=container&comp=batch).
        batch = request.method == "POST" and (request.query == "delete" or "comp=batch" in request.query)
        return "500" if request.method == "DELETE" or batch else fail_put(request)

    return decide


def backend_of(request) -> Backend:
    """The bucket (``s3``) or container (``az``) ``request.param`` names,
    from the suite's session servers."""
    if request.param == "s3":
        s3 = request.getfixturevalue("s3")
        return Backend("s3", s3.endpoint, request.getfixturevalue("bucket"), s3)
    azure = request.getfixturevalue("azure")
    return Backend("az", azure.endpoint, request.getfixturevalue("azure_container"), azure)


def leftover_journals(spool) -> list:
    return sorted((spool / "zt-uploads").glob("*.leftover"))
