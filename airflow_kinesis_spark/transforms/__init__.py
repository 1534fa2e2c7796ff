"""Ready-made transforms for ``KinesisToSparkOperator(transform="module:function")``."""
