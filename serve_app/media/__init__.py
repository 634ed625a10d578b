"""Image inputs from untrusted clients: fetching URLs without request forgery, decoding bytes without bombs."""
