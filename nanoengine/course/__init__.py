"""Course tooling: quizzes, the grader, and the widgets each chapter uses to show engine state."""
