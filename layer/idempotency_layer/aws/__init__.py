"""The AWS kit every backend signs and connects with: SigV4 (`sigv4`), TLS trust and the shipped certificate
directories (`trust`), where a request goes and as whom (`target`), and the environment's credentials and CA bundle
(`environment`). It imports nothing of `stores/`."""
