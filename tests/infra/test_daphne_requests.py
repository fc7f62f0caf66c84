"""daphne's requests skip Twisted's form parsing (``controlplane/daphne_requests.py``).

The deployment's ASGI module turns it off when daphne serves it; a request daphne builds then
carries Twisted's switch off, and a second call changes nothing. (That a JSON, form or multipart
body still reaches the API through a real daphne is in tests/integration/test_end_to_end.py.)
"""

from __future__ import annotations

from types import SimpleNamespace


def test_the_requests_daphne_builds_do_not_parse_forms():
    import daphne.http_protocol as protocol
    from twisted.web.test.requesthelper import DummyChannel

    from controlplane.daphne_requests import skip_form_parsing

    skip_form_parsing()
    patched = protocol.WebRequest
    skip_form_parsing()
    assert protocol.WebRequest is patched  # once only

    channel = DummyChannel()
    connected = []
    channel.factory = SimpleNamespace(server=SimpleNamespace(protocol_connected=connected.append))
    request = protocol.WebRequest(channel)
    assert request._parsePOSTFormSubmission is False and connected == [request]
