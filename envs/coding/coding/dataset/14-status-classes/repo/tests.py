import unittest

from http_status import status_class


class StatusTest(unittest.TestCase):
    def test_server_error(self):
        self.assertEqual(status_class(503), "server error")
