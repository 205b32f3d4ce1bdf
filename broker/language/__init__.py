"""The filter language of content-based routing: model, text grammar, interval reasoning."""
