"""The application file ``deploy/up.sh spark-demo`` gives spark-submit: the example pipeline,
``kvserver.spark.demo``, imported from raftkv's wheel that ``--py-files`` put on the path of
the driver and of every executor."""

import sys

from kvserver.spark.demo import main

sys.exit(main())
