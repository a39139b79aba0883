"""Publishing drafts: the model card and the Hub upload (huggingface_hub is imported only by these modules)."""
