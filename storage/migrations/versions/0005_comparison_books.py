"""books and comparisons apart: a kind per session

The Compare tab's runs live in a session of their own kind ("comparison"), so the Library, its rename and
the Write tab's page-load offer see only the writer's books. Sessions the Compare tab made before are
recognised by the exact title it gave them (its prompt's first six words and an ellipsis) and no author.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25 19:50:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0005'
down_revision: Union[str, Sequence[str], None] = '0004'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=20), nullable=False, server_default='book'))
    connection = op.get_bind()
    candidates = connection.execute(sa.text("SELECT id, title FROM sessions WHERE title LIKE 'Compare: %' "
                                            "AND author = ''")).fetchall()
    for session_id, title in candidates:
        if _compare_title(title):
            connection.execute(sa.text("UPDATE sessions SET kind = 'comparison' WHERE id = :id"), {"id": session_id})


def _compare_title(title: str) -> bool:
    """Exactly the title the Compare tab gave its session (no author): f"Compare: {' '.join(prompt.split()[:6])}…".
    A writer's book named "Compare: two endings" stays a book."""
    if not (title.startswith("Compare: ") and title.endswith("\u2026")):
        return False
    words = title[len("Compare: "):-1].split()
    return len(words) <= 6 and title == f"Compare: {' '.join(words)}\u2026"


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('kind')
