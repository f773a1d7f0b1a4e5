"""npudet's project-only machinery (``dev/README.md``): what the project runs to measure and
verify npudet, never what a user's training, testing, ablation, export or device check needs.
It imports npudet; npudet never imports it (``.importlinter``)."""
