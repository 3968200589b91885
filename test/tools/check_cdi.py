"""Checks phos's CDI specification (contrib/cdi/phos.json.in, as meson
generates it) against the rules of the Container Device Interface spec
(github.com/cncf-tags/container-device-interface, SPEC.md): the fields each
object may have (a runtime refuses a spec with an unknown field), the kind
"vendor/class", device names, env entries "NAME=VALUE", absolute mount paths.
Then what phos needs of it: the device preloads the libphos.so it mounts,
from where meson installs it.

usage: check_cdi.py SPEC.json LIBPHOS_PATH
       check_cdi.py --self-test   (the checker refuses broken specs)
"""
import json
import re
import sys

# Released spec versions that have every field used here (0.3.0 on); a
# runtime refuses versions it does not know, so newer features stay out.
KNOWN_VERSIONS = {"0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0"}
SPEC_FIELDS = {"cdiVersion", "kind", "annotations", "devices", "containerEdits"}
DEVICE_FIELDS = {"name", "annotations", "containerEdits"}
EDIT_FIELDS = {"env", "deviceNodes", "hooks", "mounts", "intelRdt", "additionalGids", "netDevices"}
MOUNT_FIELDS = {"hostPath", "containerPath", "options", "type"}
VENDOR = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$")
CLASS = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def problems_of(spec):
    out = []

    def fields(obj, allowed, where):
        if not isinstance(obj, dict):
            out.append("%s: not an object" % where)
            return False
        for k in obj:
            if k not in allowed:
                out.append("%s: unknown field %r" % (where, k))
        return True

    def edits(e, where):
        if not fields(e, EDIT_FIELDS, where):
            return
        for i, v in enumerate(e.get("env", [])):
            if not isinstance(v, str) or not ENV.match(v):
                out.append("%s.env[%d]: %r is not NAME=VALUE" % (where, i, v))
        for i, m in enumerate(e.get("mounts", [])):
            w = "%s.mounts[%d]" % (where, i)
            if not fields(m, MOUNT_FIELDS, w):
                continue
            for key in ("hostPath", "containerPath"):
                if not isinstance(m.get(key), str) or not m[key].startswith("/"):
                    out.append("%s.%s: an absolute path is required" % (w, key))
            if not all(isinstance(o, str) for o in m.get("options", [])):
                out.append("%s.options: strings only" % w)

    if not fields(spec, SPEC_FIELDS, "spec"):
        return out
    if spec.get("cdiVersion") not in KNOWN_VERSIONS:
        out.append("spec: cdiVersion %r is not a released version" % spec.get("cdiVersion"))
    kind = spec.get("kind", "")
    vendor, _, cls = kind.partition("/")
    if not (isinstance(kind, str) and VENDOR.match(vendor) and CLASS.match(cls)):
        out.append("spec: kind %r is not vendor/class" % kind)
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        out.append("spec: no devices")
        devices = []
    names = set()
    for i, d in enumerate(devices):
        w = "devices[%d]" % i
        if not fields(d, DEVICE_FIELDS, w):
            continue
        name = d.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            out.append("%s: name %r" % (w, name))
        if name in names:
            out.append("%s: name %r twice" % (w, name))
        names.add(name)
        if "containerEdits" not in d:
            out.append("%s: no containerEdits" % w)
        else:
            edits(d["containerEdits"], w + ".containerEdits")
    if "containerEdits" in spec:
        edits(spec["containerEdits"], "spec.containerEdits")
    return out


def phos_problems(spec, libphos):
    """The device preloads the libphos.so it mounts, from where it is installed."""
    out = []
    for d in spec.get("devices", []):
        e = d.get("containerEdits", {})
        preload = [v.split("=", 1)[1] for v in e.get("env", []) if v.startswith("LD_PRELOAD=")]
        mounted = {m.get("containerPath"): m.get("hostPath") for m in e.get("mounts", [])}
        if preload != [libphos]:
            out.append("device %s: LD_PRELOAD is %r, not %s" % (d.get("name"), preload, libphos))
        if mounted.get(libphos) != libphos:
            out.append("device %s: %s is not mounted from %s" % (d.get("name"), libphos, libphos))
        opts = next((m.get("options", []) for m in e.get("mounts", []) if m.get("containerPath") == libphos), [])
        if "ro" not in opts:
            out.append("device %s: the library is not mounted read-only" % d.get("name"))
    return out


def self_test():
    good = {"cdiVersion": "0.5.0", "kind": "phos.dev/preload",
            "devices": [{"name": "libphos", "containerEdits": {
                "env": ["LD_PRELOAD=/usr/lib/libphos.so"],
                "mounts": [{"hostPath": "/usr/lib/libphos.so", "containerPath": "/usr/lib/libphos.so",
                            "options": ["ro", "bind"]}]}}]}
    assert problems_of(good) == [] and phos_problems(good, "/usr/lib/libphos.so") == [], "the good spec is refused"
    broken = {
        "an unknown field": lambda s: s.update(extra=1),
        "a version not released": lambda s: s.update(cdiVersion="0.2.9"),
        "a kind without a class": lambda s: s.update(kind="phos.dev"),
        "a bad device name": lambda s: s["devices"][0].update(name="lib phos"),
        "no devices": lambda s: s.update(devices=[]),
        "an env entry without =": lambda s: s["devices"][0]["containerEdits"].update(env=["LD_PRELOAD"]),
        "a relative mount": lambda s: s["devices"][0]["containerEdits"]["mounts"][0].update(hostPath="lib.so"),
        "an unknown mount field": lambda s: s["devices"][0]["containerEdits"]["mounts"][0].update(mode="ro"),
    }
    for what, damage in broken.items():
        spec = json.loads(json.dumps(good))
        damage(spec)
        assert problems_of(spec), "a spec with %s passes" % what
    wrong_lib = json.loads(json.dumps(good))
    wrong_lib["devices"][0]["containerEdits"]["env"] = ["LD_PRELOAD=/elsewhere/libphos.so"]
    assert phos_problems(wrong_lib, "/usr/lib/libphos.so"), "a spec preloading another library passes"
    writable = json.loads(json.dumps(good))
    writable["devices"][0]["containerEdits"]["mounts"][0]["options"] = ["bind"]
    assert phos_problems(writable, "/usr/lib/libphos.so"), "a writable mount passes"
    print("check_cdi: self-test: the good spec passes, %d broken ones are refused" % (len(broken) + 2))


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return 0
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    self_test()
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    found = problems_of(spec) + phos_problems(spec, sys.argv[2])
    for p in found:
        print("check_cdi: %s: %s" % (sys.argv[1], p))
    if found:
        return 1
    print("check_cdi: %s: a valid CDI %s spec; %s=%s preloads %s" % (
        sys.argv[1], spec["cdiVersion"], spec["kind"], spec["devices"][0]["name"], sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
