"""A pretrained Hugging Face checkpoint as untrusted input: its files, its loading and its chat template.
"""
