"""What a gateway calls: the middleware hooks, the summarizer flush hook, the request's user, tools."""
