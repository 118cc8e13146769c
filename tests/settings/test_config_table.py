"""Every setting is declared once, in spark_statebackend.settings.KEYS (issue 24 item 2): the configuration
table of docs/configuration.md is generated from it (the README lists a few keys, with the same defaults),
and the JVM's Conf.java, which parses the keys it reads itself (it runs without Python), has the same
defaults, bounds and allowed values."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from spark_statebackend.errors import ConfigError
from spark_statebackend.settings import KEYS, PREFIX, Duration, OneOf, Setting, Text, markdown_table
from spark_statebackend.spark.enable import jar_path
from tests.jobrig import spark_jars
from tests.paths import ROOT
from tools.config_table import docs_table, links_from_docs

README = (ROOT / "README.md").read_text()
CONFIG_DOC = (ROOT / "docs" / "configuration.md").read_text()
CONF_JAVA = (ROOT / "jvm-bridge" / "src" / "dev" / "statebackend" / "spark" / "Conf.java").read_text()

BY_KEY = {s.key: s for s in KEYS}
ALIASES = {PREFIX + d: s for s in KEYS for d in s.deprecated}


def key_table(text: str, header: str) -> str:
    """The table of `text` whose header row starts with `header`: from that row to its last row."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith(header)), None)
    assert start is not None, f"no table with a `{header}` header"
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def test_the_docs_table_is_the_generated_one() -> None:
    """Regenerate with `python tools/config_table.py` and paste it over docs/configuration.md's table."""
    ours, theirs = docs_table(), key_table(CONFIG_DOC, "| key | default | type | meaning |")
    assert theirs == ours, "docs/configuration.md's table differs from `python tools/config_table.py`"


def test_the_docs_table_differs_from_settings_only_in_its_links() -> None:
    """docs_table() is markdown_table() with links relative to docs/, not another table."""
    # KEYS holds one link at least (sidecar.python's), so the two differ.
    assert docs_table() == links_from_docs(markdown_table()) != markdown_table()
    sample = "[a](docs/x.md#y) [b](jvm-bridge/README.md) [c](#z) [d](https://e/f) `docs/g.md`"
    want = "[a](x.md#y) [b](../jvm-bridge/README.md) [c](#z) [d](https://e/f) `docs/g.md`"
    assert links_from_docs(sample) == want


def test_the_readme_keys_are_declared_with_their_defaults() -> None:
    """The README's short list of keys shows each one's declared default, so it cannot drift either."""
    rows = key_table(README, "| key | default |").splitlines()[2:]
    assert len(rows) >= 5, "the README lists the keys most jobs set"
    for row in rows:
        key, default = (c.strip() for c in row[1:-1].split("|")[:2])
        setting = BY_KEY.get(key.strip("`"))
        assert setting is not None, f"the README lists {key}, which settings.KEYS does not declare"
        assert default == (f"`{setting.shown_default}`" if setting.shown_default else ""), key


def test_the_generated_table_has_every_key_with_its_default() -> None:
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(KEYS) == len(BY_KEY)
    for s, row in zip(KEYS, rows, strict=True):
        cells = [c.strip() for c in row[1:-1].split("|")]  # no doc holds a "|" (checked below)
        assert cells[0] == f"`{s.key}`"
        assert cells[1] == (f"`{s.shown_default}`" if s.shown_default else ""), s.key


@pytest.mark.parametrize("setting", KEYS, ids=lambda s: s.name)
def test_each_default_is_a_value_of_its_type(setting: Setting[object]) -> None:
    """A default the key's own parser refuses would fail every application that leaves it unset."""
    assert not (setting.default and setting.unset), "unset says what an unset key means without a default"
    if setting.default:
        setting.type.parse(setting.default, setting.key)
    assert setting.doc and not setting.doc.endswith(" ") and "|" not in setting.doc


def test_a_bad_value_names_the_key_and_the_value() -> None:
    for s in KEYS:
        if not isinstance(s.type, Text):  # any text is a value of a Text
            with pytest.raises(ConfigError) as err:
                s.type.parse("bogus", s.key)
            assert err.value.key == s.key and "bogus" in str(err.value)


# -- Conf.java ----------------------------------------------------------------------------------------

#: Key constants of Conf.java: `public static final String ENABLED = PREFIX + "enabled";`
_CONSTANT = re.compile(r"static\s+final\s+String\s+(\w+)\s*=\s*PREFIX\s*\+\s*\"([^\"]+)\"\s*;")
#: Reads with a default: bool(K, true), durationMs(K, "60s", false), conf.get(K, "process").
_BOOL = re.compile(r"\bbool\(\s*(\w+)\s*,\s*(true|false)\s*\)")
_DURATION = re.compile(r"\bdurationMs\(\s*(\w+)\s*,\s*\"([^\"]*)\"\s*,\s*(true|false)\s*\)")
_GET = re.compile(r"\bconf\.get\(\s*(\w+)\s*,\s*\"([^\"]*)\"\s*\)")
#: Keys Conf.java reads without naming them in a read call: sidecarPython's loop over its candidate
#: keys, `conf.get(k, "")`. The scan checks that loop's default instead.
_READ_IN_A_LOOP = {"sidecar.python"}


def _java_constants() -> dict[str, str]:
    constants = {name: PREFIX + key for name, key in _CONSTANT.findall(CONF_JAVA)}
    assert len(constants) >= 10, "the scan found too few key constants in Conf.java: has its form changed?"
    return constants


def _java_reads() -> dict[str, list[tuple[str, bool | None]]]:
    """Every key Conf.java reads with a default: key -> [(default text, positive for a duration)]."""
    constants = _java_constants()
    reads: dict[str, list[tuple[str, bool | None]]] = {}

    def add(const: str, default: str, positive: bool | None) -> None:
        if const in constants:  # e.g. SIDECAR_MODE; a local variable (k) is not a key constant
            reads.setdefault(constants[const], []).append((default, positive))

    for const, default in _BOOL.findall(CONF_JAVA):
        add(const, default, None)
    for const, default, positive in _DURATION.findall(CONF_JAVA):
        add(const, default, positive == "true")
    for const, default in _GET.findall(CONF_JAVA):
        add(const, default, None)
    return reads


def test_every_key_conf_java_names_is_declared() -> None:
    for name, key in _java_constants().items():
        assert key in BY_KEY or key in ALIASES, f"Conf.{name} = {key!r} is not in settings.KEYS"


def test_conf_java_reads_every_key_with_the_declared_default() -> None:
    reads = _java_reads()
    for key in set(_java_constants().values()) - set(ALIASES):
        if key.removeprefix(PREFIX) in _READ_IN_A_LOOP:
            assert 'conf.get(k, "")' in CONF_JAVA and BY_KEY[key].default == "", key
            continue
        assert key in reads, f"Conf.java reads {key} in a way this scan does not know: extend the scan"
        setting = BY_KEY[key]
        for default, positive in reads[key]:
            assert default == setting.default, (
                f"{key}: Conf.java's default {default!r}, settings.KEYS's {setting.default!r}"
            )
            if positive is not None:
                assert isinstance(setting.type, Duration) and setting.type.positive == positive, (
                    f"{key}: Conf.java {'refuses' if positive else 'accepts'} 0, settings.KEYS does not"
                )


def test_conf_java_allows_the_declared_sidecar_modes() -> None:
    mode = BY_KEY[PREFIX + "sidecar.mode"].type
    assert isinstance(mode, OneOf)
    assert set(re.findall(r"mode\.equals\(\"(\w+)\"\)", CONF_JAVA)) == set(mode.allowed)


#: Conf's accessors on an empty SparkConf, i.e. its defaults as the JVM parses them (the built jar).
PROBE = """
import dev.statebackend.spark.Conf;
import org.apache.spark.SparkConf;
public class ConfDefaults {
  public static void main(String[] args) {
    Conf c = Conf.of(new SparkConf(false));
    System.out.println(Conf.ENABLED + "=" + c.enabled());
    System.out.println(Conf.LOCAL_CHECKPOINT_FILE_MANAGER + "=" + c.localCheckpointFileManager());
    System.out.println(Conf.LINK_SST_FILES + "=" + c.linkSstFiles());
    System.out.println(Conf.DURABLE_COMMIT + "=" + c.durableCommit());
    System.out.println(Conf.METRICS_PER_STORE + "=" + c.metricsPerStore());
    System.out.println(Conf.RESTORE_TIMEOUT + "=" + c.restoreTimeoutMs());
    System.out.println(Conf.MAX_COMMIT_DELAY + "=" + c.maxCommitDelayMs());
    System.out.println(Conf.COMMIT_TIMEOUT + "=" + c.commitTimeoutMs());
    System.out.println(Conf.DRAIN_TIMEOUT + "=" + c.drainTimeoutMs());
    System.out.println(Conf.MIRROR_RETENTION + "=" + c.mirrorRetentionMs());
    System.out.println(Conf.SIDECAR_MODE + "=" + c.sidecarMode());
  }
}
"""


@pytest.mark.skipif(shutil.which("java") is None or spark_jars() is None, reason="needs java and pyspark")
def test_the_jvm_parses_the_declared_defaults_to_the_same_values(tmp_path: Path) -> None:
    """The scan above reads Conf.java's default literals; this runs the built jar's accessors, so a
    default the JVM parses differently (or a stale jar) shows too."""
    (tmp_path / "ConfDefaults.java").write_text(PROBE)
    classpath = f"{jar_path()}{os.pathsep}{spark_jars()}/*"
    proc = subprocess.run(
        ["java", "-cp", classpath, str(tmp_path / "ConfDefaults.java")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    jvm = dict(line.split("=", 1) for line in proc.stdout.splitlines())
    with_defaults = {key for key, defaults in _java_reads().items() if any(d for d, _ in defaults)}
    assert set(jvm) == with_defaults, "PROBE must print every key Conf.java reads with a default"
    for key, theirs in jvm.items():
        ours = BY_KEY[key].read({})
        assert str(ours).lower() == theirs, f"{key}: the JVM's default {theirs}, settings.KEYS's {ours}"


PLUGIN_JAVA = (
    ROOT / "jvm-bridge" / "src" / "dev" / "statebackend" / "spark" / "StateBackendPlugin.java"
).read_text()


def test_the_plugins_default_locations_are_the_declared_ones() -> None:
    """A local master's blob store and checkpoint log are resolved on the driver by the JVM plugin
    (StateBackendPlugin.defaultLocations) and by Python from `Setting.unset`: one place per side, so
    this scan keeps the two the same directories."""
    body = PLUGIN_JAVA[PLUGIN_JAVA.index("static void defaultLocations") :]
    body = body[: body.index("\n  }\n")]
    pairs = dict(re.findall(r'\{Conf\.PREFIX \+ "([\w.]+)", "([\w.-]+)"\}', body))
    (root,) = re.findall(r'toAbsolutePath\(\)\.resolve\("([\w.-]+)"\)', body)
    declared = {
        s.key.removeprefix(PREFIX): s.unset for s in KEYS if s.unset.startswith("file://<driver cwd>/")
    }
    assert pairs and set(pairs) == set(declared), (pairs, declared)
    for key, leaf in pairs.items():
        assert declared[key] == f"file://<driver cwd>/{root}/{leaf}", key
