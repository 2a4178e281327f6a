"""Your own blind A/B of two serving profiles: journalled runs, blind grading, seed-blocked statistics.

See docs/selftest.md ("Blind A/B"). Never imports Gradio.
"""
