from shared.attention.metadata import AttentionMetadata

__all__ = ["AttentionMetadata"]
