import io
import json
import unittest
from contextlib import redirect_stdout
from pathlib import Path

from tally import count_words, most_common
from tally.__main__ import main

SAMPLE = Path(__file__).resolve().parent.parent / "sample" / "words.txt"


class CountWordsTest(unittest.TestCase):
    def test_case_folded(self):
        self.assertEqual(count_words("The the THE cat"), {"the": 3, "cat": 1})

    def test_apostrophes_and_punctuation(self):
        self.assertEqual(count_words("Don't stop, don't!"), {"don't": 2, "stop": 1})

    def test_empty(self):
        self.assertEqual(count_words(""), {})


class MostCommonTest(unittest.TestCase):
    def test_ties_are_alphabetical(self):
        self.assertEqual(most_common({"b": 2, "a": 2, "c": 3}, 3), [("c", 3), ("a", 2), ("b", 2)])

    def test_negative_n(self):
        with self.assertRaises(ValueError):
            most_common({}, -1)


class CliTest(unittest.TestCase):
    def test_json_output(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(main([str(SAMPLE), "--top", "2", "--format", "json"]), 0)
        self.assertEqual(json.loads(out.getvalue()), [["the", 8], ["drill", 2]])


if __name__ == "__main__":
    unittest.main()
