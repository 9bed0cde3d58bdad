"""The security and crash fixes Sightglass carries on top of 3.11.2.

One fix per area, each checked by behaviour that pristine 3.11.2 lacks (see
Doc/sightglass/base.rst).  A build made with --without-debian-fixes
carries none of them and skips this module.
"""

import http.cookies
import ipaddress
import os
import sys
import unittest
import urllib.parse
import webbrowser
from email import utils as email_utils
from test.support import import_helper, infinite_recursion

if sys._git[1].endswith("-unpatched"):
    raise unittest.SkipTest("built with --without-debian-fixes")


class CarriedFixesTests(unittest.TestCase):

    def test_urlsplit_strips_leading_c0_and_space(self):
        # CVE-2023-24329: a leading NUL and space hid the scheme, so
        # blocklists keyed on it were bypassed.
        parts = urllib.parse.urlsplit("\x00 https://example.com/p")
        self.assertEqual(parts.scheme, "https")
        self.assertEqual(parts.netloc, "example.com")

    def test_normpath_keeps_text_after_nul(self):
        # CVE-2023-41105, in C: os.path.normpath cut the path at a NUL.
        self.assertEqual(os.path.normpath("a\x00b"), "a\x00b")
        self.assertEqual(os.path.normpath("/x/\x00y/."), "/x/\x00y")

    def test_getaddresses_rejects_malformed_addresses(self):
        # CVE-2023-27043: a malformed address yielded two addresses.
        self.assertEqual(
            email_utils.getaddresses(["alice@example.com <bob@example.com>"]),
            [("", "")])

    def test_ipaddress_special_ranges(self):
        # CVE-2024-4032: is_private/is_global wrong for IANA special ranges.
        self.assertTrue(ipaddress.ip_address("2001:3::").is_global)
        self.assertFalse(ipaddress.ip_network("2001:3::/48").is_private)

    def test_cookies_reject_control_characters(self):
        # CVE-2026-0672 and CVE-2026-3644: control characters in cookie
        # values allowed header injection.
        cookie = http.cookies.SimpleCookie()
        with self.assertRaises(http.cookies.CookieError):
            cookie["k"] = "v\x07x"
        with self.assertRaises(http.cookies.CookieError):
            http.cookies.Morsel().set("k", "v\x07", "v\x07")

    def test_webbrowser_rejects_leading_dash(self):
        # CVE-2026-4519: a URL starting with '-' became a browser option.
        browser = webbrowser.GenericBrowser(["sh", "-c", ":", "%s"])
        with self.assertRaises(ValueError):
            browser.open("--remote-debugging-port=1")

    def test_expat_deep_content_model_raises(self):
        # CVE-2026-4224, in C: deeply nested content models overflowed the
        # C stack.
        expat = import_helper.import_module("xml.parsers.expat")
        depth = 200_000
        dtd = (b"<!DOCTYPE r [\n<!ELEMENT r " + b"(a, " * depth + b"a"
               + b")" * depth + b">\n]>\n<r/>\n")
        parser = expat.ParserCreate()
        parser.ElementDeclHandler = lambda name, model: None
        with infinite_recursion():
            with self.assertRaises(RecursionError):
                parser.Parse(dtd, True)


if __name__ == "__main__":
    unittest.main()
