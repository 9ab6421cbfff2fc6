"""fitting.formats and pipelines.names: the one report formatter, JSON sanitiser and task parser."""

import json
import math

import numpy as np

from fitting import formats
from pipelines import names


def test_fmt_rounds_for_people():
    assert formats.fmt(3.490240591455167) == "3.49"
    assert formats.fmt(np.float32(0.123456)) == "0.1235"
    assert formats.fmt(12345.678, 3) == "1.23e+04"
    assert formats.fmt(None) == formats.fmt(math.nan) == formats.fmt(math.inf) == "–"
    assert formats.fmt(7) == "7" and formats.fmt("en") == "en"


def test_json_safe_and_num():
    obj = {"a": [1.5, math.nan, np.float64(2.0)], 3: (np.int64(4), math.inf)}
    safe = formats.json_safe(obj)
    assert safe == {"a": [1.5, None, 2.0], "3": [4, None]}
    json.dumps(safe, allow_nan=False)
    assert formats.num("2.5") == 2.5 and math.isnan(formats.num(None))


def test_mt_pair():
    assert names.mt_pair("mt_en_fr") == ("en", "fr")
    assert names.mt_pair("lm_en") is None and names.mt_pair("mt_eng_fr") is None
