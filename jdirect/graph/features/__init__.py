"""Feature sources: where the feature table lives and how a step reads its rows."""

from .source import FeatureSource

__all__ = ["FeatureSource"]
