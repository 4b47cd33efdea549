import unittest

from durations import parse_duration


class HiddenDurationTest(unittest.TestCase):
    def test_hours(self):
        self.assertEqual(parse_duration("2h"), 7200)

    def test_hours_and_minutes(self):
        self.assertEqual(parse_duration("1h30m"), 5400)

    def test_seconds(self):
        self.assertEqual(parse_duration("45s"), 45)

    def test_all_three(self):
        self.assertEqual(parse_duration("2h5m10s"), 7510)

    def test_not_a_duration(self):
        with self.assertRaises(ValueError):
            parse_duration("soon")
