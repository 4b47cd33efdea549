import unittest

from http_status import status_class


class HiddenStatusTest(unittest.TestCase):
    def test_success(self):
        self.assertEqual(status_class(200), "success")

    def test_redirect(self):
        self.assertEqual(status_class(301), "redirect")

    def test_client_error(self):
        self.assertEqual(status_class(404), "client error")

    def test_server_error(self):
        self.assertEqual(status_class(500), "server error")
        self.assertEqual(status_class(599), "server error")

    def test_out_of_range(self):
        with self.assertRaises(ValueError):
            status_class(600)
