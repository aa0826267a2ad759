"""Where the tests are: one folder of test/ per layer of the package (test/model/ holds the tests of oxygen_ros/model/),
a folder for the package as a whole (product/), the launch_testing files (launch/) and the fixtures' data
(fixtures/); the shared helpers and conftest.py at test/'s top with no test file beside them. In a layer's folder a
file's name starts with the layer's name or with one of its modules' (test_vla_node_ros.py: nodes/vla_node.py), and
docs/testing.md's map names every folder there is."""

import re
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "test"
PACKAGE = REPO / "oxygen_ros"
OTHER_FOLDERS = {"product", "launch", "fixtures"}


def folders() -> set[str]:
    return {path.name for path in TESTS.iterdir() if path.is_dir() and path.name != "__pycache__"}


def layers() -> set[str]:
    return {path.parent.name for path in PACKAGE.glob("*/__init__.py")}


def suite_files() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def test_no_test_file_sits_at_the_top_of_test():
    assert sorted(path.name for path in TESTS.glob("test_*.py")) == []


def test_each_folder_is_a_layer_of_the_package_and_each_layer_has_its_folder():
    assert folders() - OTHER_FOLDERS == layers(), "test/ folders without a package layer, or layers without a folder"
    assert OTHER_FOLDERS <= folders()


def test_a_files_name_starts_with_its_layer_or_one_of_the_layers_modules():
    misnamed = []
    for path in suite_files():
        layer = path.parent.name
        if layer in OTHER_FOLDERS:
            continue
        modules = {layer} | {module.stem for module in (PACKAGE / layer).glob("*.py")} | {
            package.parent.name for package in (PACKAGE / layer).glob("*/__init__.py")}
        topic = path.stem.removeprefix("test_")
        if not any(topic == module or topic.startswith(module + "_") for module in modules):
            misnamed.append(str(path.relative_to(TESTS)))
    assert misnamed == []


def test_test_modules_are_plain_files_with_names_unique_across_folders():
    # pytest imports each test file as a top-level module named after it (the folders are no packages), and tests
    # take helpers from each other's modules by that name (test/conftest.py puts every folder on the import path).
    assert sorted(str(path.relative_to(TESTS)) for path in TESTS.rglob("__init__.py")) == []
    repeated = [name for name, count in Counter(path.name for path in suite_files()).items() if count > 1]
    assert repeated == []


def test_the_testing_page_maps_every_folder():
    page = (REPO / "docs" / "testing.md").read_text()
    assert set(re.findall(r"^\| `test/(\w+)/` \|", page, flags=re.MULTILINE)) == folders()
