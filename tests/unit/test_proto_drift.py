"""The checked-in stubs under shared/pb/ match proto/ (run scripts/gen_proto.py after editing a .proto)."""

import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GEN_PROTO = REPO_ROOT / "scripts" / "gen_proto.py"
# Words the leading comment of every .proto must contain (see proto/pdserve/v1/kv_transfer.proto).
SCHEMA_RULE_WORDS = ("package pdserve.v1", "never reuse or retype", "optional", "pdserve.v2")


def gen_proto(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GEN_PROTO), *arguments], capture_output=True, text=True, cwd=REPO_ROOT)


def copy_of_checked_in_stubs(tmp_path: Path) -> Path:
    out_root = tmp_path / "pb"
    shutil.copytree(REPO_ROOT / "shared" / "pb", out_root, ignore=shutil.ignore_patterns("__pycache__"))
    return out_root


def test_checked_in_stubs_match_the_protos():
    completed = gen_proto("--check")
    assert completed.returncode == 0, completed.stderr


def test_check_fails_on_an_edited_stub(tmp_path):
    out_root = copy_of_checked_in_stubs(tmp_path)
    stub = out_root / "pdserve" / "v1" / "kv_transfer_pb2.py"
    stub.write_text(stub.read_text() + "# hand edit\n")
    completed = gen_proto("--check", "--out-root", str(out_root))
    assert completed.returncode == 1
    assert "proto drift: stale: v1/kv_transfer_pb2.py" in completed.stderr


def test_check_fails_on_a_stub_without_a_proto(tmp_path):
    out_root = copy_of_checked_in_stubs(tmp_path)
    (out_root / "pdserve" / "v1" / "orphan_pb2.py").write_text("")
    completed = gen_proto("--check", "--out-root", str(out_root))
    assert completed.returncode == 1
    assert "proto drift: unexpected: v1/orphan_pb2.py" in completed.stderr


def test_generated_imports_point_inside_shared_pb(tmp_path):
    proto_root = tmp_path / "proto"
    (proto_root / "pdserve" / "v1").mkdir(parents=True)
    (proto_root / "pdserve" / "v1" / "base.proto").write_text(
        'syntax = "proto3";\npackage pdserve.v1;\nmessage Ping { string text = 1; }\n'
    )
    (proto_root / "pdserve" / "v1" / "echo.proto").write_text(
        'syntax = "proto3";\npackage pdserve.v1;\nimport "pdserve/v1/base.proto";\n'
        "service Echo { rpc Say(Ping) returns (Ping); }\n"
    )
    out_root = tmp_path / "pb"
    assert gen_proto("--proto-root", str(proto_root), "--out-root", str(out_root)).returncode == 0
    grpc_stub = (out_root / "pdserve" / "v1" / "echo_pb2_grpc.py").read_text()
    assert "from shared.pb.pdserve.v1 import base_pb2 as pdserve_dot_v1_dot_base__pb2" in grpc_stub
    assert sorted(p.name for p in (out_root / "pdserve").rglob("__init__.py")) == ["__init__.py", "__init__.py"]
    assert gen_proto("--check", "--proto-root", str(proto_root), "--out-root", str(out_root)).returncode == 0


def test_every_proto_states_the_schema_rules_and_package():
    proto_files = sorted((REPO_ROOT / "proto").rglob("*.proto"))
    assert proto_files, "no .proto files found"
    for proto_file in proto_files:
        text = proto_file.read_text()
        header_comment = text[: text.index("syntax")].lower()
        for rule in SCHEMA_RULE_WORDS:
            assert rule in header_comment, f"{proto_file.name}: schema rule missing: {rule!r}"
        assert "\npackage pdserve.v1;\n" in text, f"{proto_file.name}: not in package pdserve.v1"
