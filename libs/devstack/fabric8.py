"""fabric8's Kubernetes client (Java): its jars from Maven Central, cached by version, and a
small program (tests/fixtures/java) compiled against them that lists namespaces with a
kubeconfig. `python -m devstack.fabric8` fetches and compiles ahead of the tests.

Why: the local clusters' kubeconfigs must work with the clients users bring; fabric8 (Spark's)
is the strictest common one about key formats (tests/integration/test_java_kubeconfig.py).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from pathlib import Path

from devstack.config import Settings

FABRIC8_VERSION = "6.13.4"
SLF4J_NOP_VERSION = "2.0.16"
PROGRAM = (Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "java"
           / "ListNamespaces.java")
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.lockgate</groupId><artifactId>fabric8-client</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>io.fabric8</groupId><artifactId>kubernetes-client</artifactId>
      <version>{fabric8}</version>
    </dependency>
    <dependency>
      <groupId>org.slf4j</groupId><artifactId>slf4j-nop</artifactId><version>{nop}</version>
    </dependency>
  </dependencies>
</project>
"""


def fabric8_dir(settings: Settings | None = None) -> Path:
    return (settings or Settings.from_env()).cache_dir / "java" / f"fabric8-{FABRIC8_VERSION}"


def ensure_fabric8(settings: Settings | None = None) -> tuple[Path, float]:
    """The directory holding the jars and the compiled program; and the seconds it took."""
    started = time.monotonic()
    home = fabric8_dir(settings)
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f"{home.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / ".complete").exists():
            for tool in ("mvn", "javac", "java"):
                if shutil.which(tool) is None:
                    raise RuntimeError(f"{tool} is missing: the fabric8 test needs a JDK and "
                                       "Maven (apt-get install -y default-jdk-headless maven)")
            shutil.rmtree(home, ignore_errors=True)
            (home / "jars").mkdir(parents=True)
            (home / "pom.xml").write_text(_POM.format(fabric8=FABRIC8_VERSION,
                                                      nop=SLF4J_NOP_VERSION))
            done = subprocess.run(
                ["mvn", "-B", "-q", "-f", str(home / "pom.xml"), "dependency:copy-dependencies",
                 f"-DoutputDirectory={home / 'jars'}", "-DincludeScope=runtime"],
                capture_output=True, text=True, timeout=900, check=False)
            if done.returncode != 0 or not any((home / "jars").glob("kubernetes-client-*.jar")):
                raise RuntimeError(f"downloading fabric8 {FABRIC8_VERSION} failed "
                                   f"(mvn exit {done.returncode}):\n{done.stdout[-3000:]}"
                                   f"{done.stderr[-2000:]}")
            (home / "jars").joinpath(".complete").touch()
            (home / ".complete").write_text(FABRIC8_VERSION + "\n")
        classes = home / "classes"
        compiled = classes / "ListNamespaces.class"
        if not compiled.exists() or compiled.stat().st_mtime < PROGRAM.stat().st_mtime:
            classes.mkdir(exist_ok=True)
            done = subprocess.run(["javac", "-d", str(classes), "-cp", f"{home / 'jars'}/*",
                                   str(PROGRAM)], capture_output=True, text=True, timeout=300,
                                  check=False)
            if done.returncode != 0:
                raise RuntimeError(f"javac failed:\n{done.stderr[-3000:]}")
    return home, time.monotonic() - started


def list_namespaces(home: Path, kubeconfig: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["java", "-cp", f"{home / 'classes'}:{home / 'jars'}/*", "ListNamespaces",
         str(kubeconfig)], capture_output=True, text=True, timeout=600, check=False)


if __name__ == "__main__":
    where, took = ensure_fabric8()
    print(f"fabric8 {FABRIC8_VERSION} in {where} ({took:.1f}s)", file=sys.stderr)
