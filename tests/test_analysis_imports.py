"""``import retime.analysis`` leaves the report (and matplotlib) unloaded until it is used:
``analyze`` and ``replay`` import the analysis package and never draw."""

import subprocess
import sys

import pytest

_PROBE = """
import sys
import retime.analysis as A
before = 'matplotlib' in sys.modules
from retime.analysis import build_report, write_report
import retime.analysis.report as R
print(before, 'matplotlib' in sys.modules, build_report is R.build_report,
      write_report is R.write_report, set(A.__all__) <= set(dir(A)))
"""


def test_report_names_load_on_first_use():
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       check=True)
    assert r.stdout.split() == ["False", "True", "True", "True", "True"]


def test_unknown_name_is_an_attribute_error():
    import retime.analysis as A

    with pytest.raises(AttributeError, match="no_such_name"):
        A.no_such_name  # noqa: B018
