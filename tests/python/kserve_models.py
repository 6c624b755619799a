"""Checks KServe manifests against the KServe SDK's generated model classes
(PyPI `kserve`: kserve.models.V1alpha1ServingRuntime,
V1beta1InferenceService, ...), recursively through their nested types,
including the kubernetes client's (V1Container, V1ObjectMeta, ...): every
field must be one the SDK's `attribute_map` names, and every value must have
the type its `openapi_types` gives.

Two roles in one file:
- imported by tests/python/test_deploy.py (the suite's venv, which has no
  kserve): `check(docs)` runs this file as a script in the KServe SDK venv
  that scripts/setup.sh makes (scripts/requirements-kserve.txt);
- run as a script there: reads {"docs": [...]} as JSON on stdin, prints a
  JSON list with one list of error strings per document.

`kserve/__init__.py` starts by importing its model server (fastapi, pandas,
grpc, ...), which is not installed; its `models` package imports only the
generated classes. So the `kserve`, `kubernetes` and `kubernetes.client`
packages are registered as bare packages (their directories, without
running their `__init__.py`) and only the two `models` packages run."""

import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REQUIREMENTS = ROOT / "scripts" / "requirements-kserve.txt"


def cache_dir():
    """The cache scripts/setup.sh and scripts/build-image.sh use."""
    if os.environ.get("SHARDSERVE_CACHE_DIR"):
        return pathlib.Path(os.environ["SHARDSERVE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "shardserve"


def venv():
    """The KServe SDK venv for the current requirements (setup.sh's rule)."""
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    return cache_dir() / f"kserve-sdk-{digest}"


def check(docs):
    """One list of errors per document (empty: valid). Raises RuntimeError
    with the reason when the SDK venv is missing or the checker fails."""
    v = venv()
    python = v / "bin" / "python"
    if not (v / ".complete").is_file():
        raise RuntimeError(
            f"the KServe SDK venv {v} is missing: scripts/setup.sh installs it "
            f"(scripts/requirements-kserve.txt)")
    out = subprocess.run([str(python), str(pathlib.Path(__file__).resolve())],
                         input=json.dumps({"docs": docs}), capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"kserve_models.py failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout)


def load_models():
    import importlib
    import importlib.util
    import sysconfig

    site = pathlib.Path(sysconfig.get_paths()["purelib"])
    for name in ("kserve", "kubernetes", "kubernetes.client"):
        spec = importlib.util.spec_from_loader(name, loader=None, is_package=True)
        module = importlib.util.module_from_spec(spec)
        module.__path__ = [str(site.joinpath(*name.split(".")))]
        sys.modules[name] = module
    return (importlib.import_module("kserve.models"),
            importlib.import_module("kubernetes.client.models"))


# ResourceQuantity (kserve's name for a Kubernetes quantity: `2`, "500m",
# "4Gi") is no class; bytes are base64 text in a manifest.
PRIMITIVES = {"str", "int", "float", "bool", "object", "datetime", "date", "bytes",
              "ResourceQuantity"}


class Checker:
    def __init__(self):
        self.packages = load_models()

    def model(self, name):
        for package in self.packages:
            cls = getattr(package, name, None)
            if cls is not None:
                return cls
        return None

    def primitive(self, value, typ):
        if typ == "object":
            return True
        if typ in ("str", "datetime", "date", "bytes"):
            return isinstance(value, str)
        if typ == "ResourceQuantity":
            return isinstance(value, (str, int, float)) and not isinstance(value, bool)
        if isinstance(value, bool):
            return typ == "bool"
        if typ == "int":
            return isinstance(value, int)
        if typ == "float":
            return isinstance(value, (int, float))
        return False

    def value(self, value, typ, path, errors):
        # KServe's classes spell containers the legacy generator's way
        # (list[X], dict(str, X)), the kubernetes client's the newer
        # pydantic generator's (List[X], Dict[str, X]).
        m = re.fullmatch(r"(?:list|List)\[(.+)\]", typ)
        if m:
            if not isinstance(value, list):
                errors.append(f"{path}: expected a list ({typ}), got {type(value).__name__}")
                return
            for i, item in enumerate(value):
                self.value(item, m.group(1), f"{path}[{i}]", errors)
            return
        m = re.fullmatch(r"dict\(str, (.+)\)|Dict\[str, (.+)\]", typ)
        if m:
            if not isinstance(value, dict):
                errors.append(f"{path}: expected a mapping ({typ}), got {type(value).__name__}")
                return
            for k, item in value.items():
                self.value(item, m.group(1) or m.group(2), f"{path}.{k}", errors)
            return
        if typ in PRIMITIVES:
            if not self.primitive(value, typ):
                errors.append(f"{path}: expected {typ}, got {type(value).__name__} {value!r}")
            return
        cls = self.model(typ)
        if cls is None:
            errors.append(f"{path}: the SDK names type {typ}, which neither models package has")
            return
        self.obj(value, cls, path, errors)

    def obj(self, value, cls, path, errors):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a {cls.__name__} mapping, got "
                          f"{type(value).__name__} {value!r}")
            return
        by_json = {json_name: attr for attr, json_name in cls.attribute_map.items()}
        for key, item in value.items():
            attr = by_json.get(key)
            if attr is None:
                errors.append(f"{path}.{key}: no such field in {cls.__name__} "
                              f"(fields: {', '.join(sorted(by_json))})")
                continue
            self.value(item, cls.openapi_types[attr], f"{path}.{key}", errors)

    def document(self, doc):
        """`apiVersion: group/v1beta1`, `kind: InferenceService` is the SDK's
        V1beta1InferenceService."""
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            return ["not a Kubernetes object (apiVersion and kind)"]
        version = str(doc["apiVersion"]).rsplit("/", 1)[-1]
        name = version[:1].upper() + version[1:] + str(doc["kind"])
        cls = self.model(name)
        if cls is None:
            return [f"the KServe SDK has no model {name} for {doc['apiVersion']} {doc['kind']}"]
        errors = []
        self.obj(doc, cls, doc["kind"], errors)
        return errors


def main():
    docs = json.load(sys.stdin)["docs"]
    checker = Checker()
    json.dump([checker.document(d) for d in docs], sys.stdout)


if __name__ == "__main__":
    main()
