"""A loopback stand-in for the Hugging Face Hub, for push tests without internet.

It serves the routes that `HfApi.create_repo` / `create_branch` / `create_commit` / `upload_folder` use on the
non-xet path (reference hub-and-style.md §B2.3) and `HfApi.whoami` (`/api/whoami-v2`), with the checks the real Hub
makes that a client bug would trip: bearer auth, write permission of the token (role `write`, `read`, or
`fineGrained` with `repo.write` scoped to a namespace), sha256 of every LFS upload, commits that reference only
uploaded LFS objects, valid card YAML. It
records every request, repo, branch, commit and LFS object so tests can compare bytes. Standard library plus
PyYAML (to parse card front matter the way the Hub does).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

_TYPE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_REPO = r"(?P<type>models|datasets|spaces)/(?P<ns>[^/]+)/(?P<name>[^/]+)"
_ROUTES = [
    ("GET", re.compile(r"^/api/whoami-v2$"), "whoami"),
    ("POST", re.compile(r"^/api/repos/create$"), "create_repo"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("POST", re.compile(rf"^/api/{_REPO}/preupload/(?P<rev>[^/]+)$"), "preupload"),
    ("POST", re.compile(rf"^/api/{_REPO}/commit/(?P<rev>[^/]+)$"), "commit"),
    ("POST", re.compile(rf"^/api/{_REPO}/branch/(?P<branch>[^/]+)$"), "create_branch"),
    ("GET", re.compile(rf"^/api/{_REPO}(?:/revision/(?P<rev>[^/]+))?$"), "repo_info"),
    ("POST", re.compile(r"^/(?:(?P<prefix>datasets|spaces)/)?(?P<ns>[^/]+)/(?P<name>[^/]+)"
                        r"\.git/info/lfs/objects/batch$"),
     "lfs_batch"),
    ("PUT", re.compile(r"^/lfs-objects/(?P<oid>[0-9a-f]{64})$"), "lfs_upload"),
]
ROUTE_NAMES = tuple(name for _, _, name in _ROUTES)
WRITE_ROUTES = frozenset({"create_repo", "preupload", "commit", "create_branch", "lfs_batch"})


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    target: str  # path and query exactly as sent
    route: str  # a name from ROUTE_NAMES, or "unknown"
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class StoredFile:
    data: bytes
    lfs: bool  # committed as an lfsFile pointer (True) or inline base64 (False)


@dataclass(frozen=True)
class Commit:
    oid: str
    branch: str
    parent: str | None
    summary: str
    description: str
    added: tuple[str, ...]
    deleted: tuple[str, ...]
    ndjson_keys: tuple[str, ...]  # the "key" of every NDJSON line, in order
    pr_number: int | None


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    branches: dict[str, dict[str, StoredFile]] = field(default_factory=dict)
    heads: dict[str, str] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)
    pull_requests: int = 0

    def files(self, branch: str = "main") -> dict[str, bytes]:
        return {path: f.data for path, f in self.branches[branch].items()}

    def lfs_paths(self, branch: str = "main") -> set[str]:
        return {path for path, f in self.branches[branch].items() if f.lfs}


class HubError(Exception):
    """Aborts a handler with an HTTP error response shaped like the Hub's."""

    def __init__(self, status: int, message: str, *, code: str | None = None, body: dict | None = None):
        super().__init__(message)
        self.status, self.code, self.body = status, code, body


class FakeHub:
    """The server plus everything it recorded. Use as a context manager (or start()/stop())."""

    def __init__(self, *, token: str = "hf_loopback_secret_token", user: str = "fake-user",
                 orgs: dict[str, str] | None = None, lfs_threshold: int = 10_000):
        self.token = token
        self.user = user
        self.orgs = dict(orgs if orgs is not None else {"eagle-org": "write"})  # org name -> roleInOrg
        self.tokens: dict[str, dict] = {token: {"displayName": "loopback", "role": "write"}}  # -> accessToken
        self.lfs_threshold = lfs_threshold  # files of at least this many bytes are asked to go through LFS
        self.repos: dict[tuple[str, str], Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}
        self.requests: list[RecordedRequest] = []
        self.access_log: list[str] = []
        self.validated_cards: list[str] = []
        self.server_errors: list[str] = []  # handler crashes: a bug in this server, never a client error
        self._faults: dict[str, list[int]] = {}
        self._expected_sizes: dict[str, int] = {}
        self._upload_signature = secrets.token_hex(8)
        self._commit_counter = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.hub = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # ---------------------------------------------------------------- test helpers

    def fail(self, route: str, status: int = 503, times: int = 1) -> None:
        """Answer the next `times` requests to `route` with `status`, then behave normally."""
        if route not in ROUTE_NAMES:
            raise ValueError(f"unknown route {route!r}; known: {ROUTE_NAMES}")
        self._faults.setdefault(route, []).extend([status] * times)

    def add_token(self, token: str, role: str, scoped: dict[str, list[str]] | None = None) -> str:
        """Accept `token` as well, with this role (`read`, `write`, `fineGrained`); `scoped`: for a fine-grained
        token, entity name (user, org or ORG/NAME) -> permissions, as whoami-v2 lists them."""
        access: dict = {"displayName": f"{role} token", "role": role}
        if role == "fineGrained":
            access["fineGrained"] = {"canReadGatedRepos": False, "global": ["discussion.write"], "scoped": [
                {"entity": {"_id": secrets.token_hex(12), "type": _entity_type(name, self.user), "name": name},
                 "permissions": list(permissions)} for name, permissions in (scoped or {}).items()]}
        self.tokens[token] = access
        return token

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        return self.repos[(repo_type, repo_id)]

    def calls(self, route: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.route == route]

    # ---------------------------------------------------------------- routes

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, dict, bytes, str]:
        """Return (status, extra headers, body, route name)."""
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        for route_method, pattern, name in _ROUTES:
            match = pattern.match(parts.path) if route_method == method else None
            if match is None:
                continue
            args = {k: unquote(v) for k, v in match.groupdict().items() if v is not None}
            try:
                if name == "lfs_upload":
                    if query.get("sig") != self._upload_signature:
                        raise HubError(403, "invalid upload signature")
                else:
                    access = self._check_auth(headers)
                    if name in WRITE_ROUTES:
                        self._check_write(access, args, body)
                    args["access"] = access
                with self._lock:
                    if self._faults.get(name):
                        status = self._faults[name].pop(0)
                        raise HubError(status, f"injected fault {status}")
                    handler = getattr(self, f"_route_{name}")
                    status, payload, content_type = handler(args, query, headers, body)
            except HubError as err:
                error = dict(err.body or {}, error=str(err))
                extra = {"X-Error-Message": str(err)}
                if err.code:
                    extra["X-Error-Code"] = err.code
                return err.status, {"Content-Type": "application/json", **extra}, json.dumps(error).encode(), name
            except Exception as exc:  # noqa: BLE001 - report, do not kill the connection
                self.server_errors.append(f"{name}: {type(exc).__name__}: {exc}")
                crashed = json.dumps({"error": "fake hub crashed"}).encode()
                return 500, {"Content-Type": "application/json"}, crashed, name
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            return status, {"Content-Type": content_type}, data, name
        return 404, {"Content-Type": "application/json"}, json.dumps({"error": "no such route"}).encode(), "unknown"

    def _check_auth(self, headers: dict[str, str]) -> dict:
        """The accessToken record of the bearer token; 401 for none or an unknown one."""
        auth = headers.get("authorization", "")
        if not auth.startswith("Bearer "):
            raise HubError(401, "Invalid username or password.")
        access = self.tokens.get(auth[len("Bearer "):])
        if access is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return access

    def _check_write(self, access: dict, args: dict, body: bytes) -> None:
        """403 unless the token may write to the namespace: a write token, or a fine-grained one with repo.write
        scoped to the namespace or the repository (the Hub's rule)."""
        if "ns" in args:
            namespace, repo_id = args["ns"], f"{args['ns']}/{args['name']}"
        else:
            doc = self._json(body)
            namespace = doc.get("organization") or self.user
            repo_id = f"{namespace}/{doc.get('name')}"
        if access["role"] in ("write", "admin"):
            return
        if access["role"] == "fineGrained" and any(
                "repo.write" in scope["permissions"] and scope["entity"]["name"] in (namespace, repo_id)
                for scope in access["fineGrained"]["scoped"]):
            return
        raise HubError(403, f"You don't have the rights to write to {repo_id}", code="RepoForbidden")

    def _json(self, body: bytes) -> dict:
        try:
            doc = json.loads(body or b"null")
        except json.JSONDecodeError as exc:
            raise HubError(400, f"invalid JSON body: {exc}") from None
        if not isinstance(doc, dict):
            raise HubError(400, "JSON body must be an object")
        return doc

    def _repo(self, args: dict) -> Repo:
        repo_type = (args.get("type") or (args.get("prefix") or "models"))[:-1]
        repo = self.repos.get((repo_type, f"{args['ns']}/{args['name']}"))
        if repo is None:
            raise HubError(404, "Repository not found", code="RepoNotFound")
        return repo

    def _branch(self, repo: Repo, revision: str) -> str:
        if revision not in repo.branches:
            raise HubError(404, f"Invalid rev id: {revision}", code="RevisionNotFound")
        return revision

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.endpoint}/{_TYPE_PREFIX[repo.repo_type]}{repo.repo_id}"

    def _route_whoami(self, args, query, headers, body):
        orgs = [{"type": "org", "id": hashlib.sha1(name.encode()).hexdigest()[:24], "name": name, "fullname": name,
                 "roleInOrg": role} for name, role in self.orgs.items()]
        return 200, {"type": "user", "id": hashlib.sha1(self.user.encode()).hexdigest()[:24], "name": self.user,
                     "fullname": self.user, "email": None, "emailVerified": True, "isPro": False, "orgs": orgs,
                     "auth": {"type": "access_token", "accessToken": args["access"]}}, "application/json"

    def _route_create_repo(self, args, query, headers, body):
        doc = self._json(body)
        name = doc.get("name")
        if not isinstance(name, str) or not name:
            raise HubError(400, "name is required")
        repo_type = doc.get("type") or "model"
        if repo_type not in _TYPE_PREFIX:
            raise HubError(400, f"invalid repo type {repo_type!r}")
        repo_id = f"{doc.get('organization') or self.user}/{name}"
        if (repo_type, repo_id) in self.repos:
            existing = self.repos[(repo_type, repo_id)]
            raise HubError(409, "You already created this model repo", body={"url": self._repo_url(existing)})
        private = doc.get("visibility") == "private" or doc.get("private") is True
        repo = Repo(repo_id, repo_type, private, branches={"main": {}})
        repo.heads["main"] = self._new_commit_oid("initial commit")
        self.repos[(repo_type, repo_id)] = repo
        return 200, {"url": self._repo_url(repo), "name": repo_id}, "application/json"

    def _route_validate_yaml(self, args, query, headers, body):
        doc = self._json(body)
        content = doc.get("content")
        if not isinstance(content, str):
            raise HubError(400, "content is required")
        self.validated_cards.append(content)
        errors = card_metadata_errors(content)
        if errors is None:
            no_metadata = {"message": "empty or missing yaml metadata in repo card"}
            return 200, {"errors": [], "warnings": [no_metadata]}, "application/json"
        if errors:
            raise HubError(400, "invalid metadata", body={"errors": [{"message": e} for e in errors], "warnings": []})
        return 200, {"errors": [], "warnings": []}, "application/json"

    def _route_preupload(self, args, query, headers, body):
        repo = self._repo(args)
        self._branch(repo, args["rev"])
        files = self._json(body).get("files")
        if not isinstance(files, list):
            raise HubError(400, "files must be a list")
        answer = []
        for entry in files:
            if (not isinstance(entry, dict) or not isinstance(entry.get("path"), str)
                    or not isinstance(entry.get("size"), int)):
                raise HubError(400, "each file needs a path and an integer size")
            base64.b64decode(entry.get("sample", ""), validate=True)
            mode = "lfs" if entry["size"] >= self.lfs_threshold else "regular"
            answer.append({"path": entry["path"], "uploadMode": mode, "shouldIgnore": False, "oid": None})
        return 200, {"files": answer}, "application/json"

    def _route_lfs_batch(self, args, query, headers, body):
        self._repo(args)
        doc = self._json(body)
        if doc.get("operation") != "upload" or doc.get("hash_algo", "sha256") != "sha256":
            raise HubError(400, "only sha256 uploads are supported")
        objects = []
        for obj in doc.get("objects") or []:
            oid, size = obj.get("oid"), obj.get("size")
            if not (isinstance(oid, str) and re.fullmatch(r"[0-9a-f]{64}", oid) and isinstance(size, int)):
                raise HubError(400, "each object needs a sha256 oid and an integer size")
            entry = {"oid": oid, "size": size}
            if oid not in self.lfs_objects:
                self._expected_sizes[oid] = size
                href = f"{self.endpoint}/lfs-objects/{oid}?sig={self._upload_signature}"
                entry["actions"] = {"upload": {"href": href}}
            objects.append(entry)
        return 200, {"transfer": "basic", "objects": objects}, "application/vnd.git-lfs+json"

    def _route_lfs_upload(self, args, query, headers, body):
        oid = args["oid"]
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, "sha256 of the uploaded content does not match the oid")
        expected = self._expected_sizes.get(oid)
        if expected is None:
            raise HubError(400, "no batch request announced this object")
        if expected != len(body):
            raise HubError(400, f"size {len(body)} does not match the announced {expected}")
        self.lfs_objects[oid] = body
        return 200, b"", "text/plain"

    def _route_commit(self, args, query, headers, body):
        repo = self._repo(args)
        base = self._branch(repo, args["rev"])
        if not headers.get("content-type", "").startswith("application/x-ndjson"):
            raise HubError(400, "commit payload must be application/x-ndjson")
        try:
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HubError(400, f"invalid NDJSON: {exc}") from None
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the first NDJSON line must be the header")
        header = lines[0]["value"]
        if header.get("parentCommit") and header["parentCommit"] != repo.heads[base]:
            raise HubError(412, "parent commit is not the head of the revision")
        tree = dict(repo.branches[base])
        added, deleted = [], []
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value") or {}
            path = value.get("path")
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, "regular files must be base64-encoded")
                tree[path] = StoredFile(base64.b64decode(value["content"], validate=True), lfs=False)
                added.append(path)
            elif key == "lfsFile":
                oid = value.get("oid")
                if value.get("algo") != "sha256" or oid not in self.lfs_objects:
                    raise HubError(400, f"LFS object {oid} for {path} was never uploaded")
                if len(self.lfs_objects[oid]) != value.get("size"):
                    raise HubError(400, f"LFS object {oid} has a different size than the commit says")
                tree[path] = StoredFile(self.lfs_objects[oid], lfs=True)
                added.append(path)
            elif key == "deletedFile":
                if tree.pop(path, None) is None:
                    raise HubError(404, f"A file with this name doesn't exist: {path}", code="EntryNotFound")
                deleted.append(path)
            elif key == "deletedFolder":
                folder = path.rstrip("/") + "/"
                deleted.extend(p for p in list(tree) if p.startswith(folder) and tree.pop(p))
            else:
                raise HubError(400, f"unknown NDJSON key {key!r}")
        pr_number = None
        branch = base
        if query.get("create_pr") == "1":
            repo.pull_requests += 1
            pr_number = repo.pull_requests
            branch = f"refs/pr/{pr_number}"
        oid = self._new_commit_oid(header.get("summary", ""))
        repo.commits.append(Commit(
            oid, branch, repo.heads[base], header.get("summary", ""), header.get("description", ""),
            tuple(added), tuple(deleted), tuple(line.get("key") for line in lines), pr_number,
        ))
        repo.branches[branch] = tree
        repo.heads[branch] = oid
        answer = {"commitUrl": f"{self._repo_url(repo)}/commit/{oid}", "commitOid": oid, "success": True}
        if pr_number is not None:
            answer["pullRequestUrl"] = f"{self._repo_url(repo)}/discussions/{pr_number}"
        return 200, answer, "application/json"

    def _route_create_branch(self, args, query, headers, body):
        repo = self._repo(args)
        branch = args["branch"]
        if branch in repo.branches:
            raise HubError(409, "Reference already exists")
        start = self._branch(repo, self._json(body).get("startingPoint") or "main")
        repo.branches[branch] = dict(repo.branches[start])
        repo.heads[branch] = repo.heads[start]
        return 200, {}, "application/json"

    def _route_repo_info(self, args, query, headers, body):
        repo = self._repo(args)
        branch = self._branch(repo, args.get("rev", "main"))
        info = {
            "id": repo.repo_id, "sha": repo.heads[branch], "private": repo.private, "tags": [],
            "siblings": [{"rfilename": path} for path in sorted(repo.branches[branch])],
        }
        return 200, info, "application/json"

    def _new_commit_oid(self, summary: str) -> str:
        self._commit_counter += 1
        return hashlib.sha1(f"{self._commit_counter}:{summary}".encode()).hexdigest()


def _entity_type(name: str, user: str) -> str:
    return "model" if "/" in name else "user" if name == user else "org"


def card_metadata_errors(content: str) -> list[str] | None:
    """Parse a README's YAML front matter: None if there is none, else the list of problems (empty when valid)."""
    match = re.match(r"^---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", content, re.DOTALL)
    if match is None:
        return None
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        return [f"Invalid YAML: {' '.join(str(exc).split())}"]
    if data is None:
        return None
    if not isinstance(data, dict):
        return ["metadata must be a YAML mapping"]
    errors = []
    tags = data.get("tags", [])
    if not (isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        errors.append('"tags" must be a list of strings')
    base = data.get("base_model", [])
    if not (isinstance(base, str) or (isinstance(base, list) and all(isinstance(b, str) for b in base))):
        errors.append('"base_model" must be a string or a list of strings')
    for key in ("pipeline_tag", "library_name", "base_model_relation"):
        if key in data and not isinstance(data[key], str):
            errors.append(f'"{key}" must be a string')
    return errors


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's pooled connections expect
    timeout = 30

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _dispatch(self, method: str) -> None:
        hub: FakeHub = self.server.hub  # type: ignore[attr-defined]
        body = self._read_body()
        headers = {k.lower(): v for k, v in self.headers.items()}
        status, extra, data, route = hub.handle(method, self.path, headers, body)
        with hub._lock:
            hub.requests.append(RecordedRequest(method, self.path, route, status, headers, body))
        self.send_response(status)
        for key, value in extra.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:
        self.server.hub.access_log.append(format % args)  # type: ignore[attr-defined]
