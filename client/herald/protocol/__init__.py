"""Herald's protocol vocabulary, shared by the server and the SDK (as Kafka's ``Errors``
is shared by client and broker): the errors of PROTOCOL §2 with their status, problem
code and close code (`errors`), the WebSocket close codes of §3 (`close_codes`), the
limits and integer ranges of §2-§8 (`limits`), the grammar of topic and subscription
names (`names`) and of subscription filters (`filter`).

It is the bottom of the import graph: its modules import only each other and the
standard library, and every layer of the server (storage included) imports it.
"""
