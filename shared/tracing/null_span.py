"""What tracing hands out while it is off: one span that records nothing, and one context
manager that yields it, shared by every caller (no allocation per request)."""


class NullSpan:
    def set_attribute(self, key, value) -> None:
        return None

    def set_attributes(self, attributes) -> None:
        return None

    def add_event(self, name, attributes=None, timestamp=None) -> None:
        return None

    def record_exception(self, exception, attributes=None, timestamp=None, escaped=False) -> None:
        return None

    def set_status(self, status, description=None) -> None:
        return None

    def end(self, end_time=None) -> None:
        return None

    def is_recording(self) -> bool:
        return False


NULL_SPAN = NullSpan()


class NullSpanContext:
    def __enter__(self) -> NullSpan:
        return NULL_SPAN

    def __exit__(self, *exc_info) -> bool:
        return False
