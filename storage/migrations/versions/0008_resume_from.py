"""where a draft's own text starts in its prompt ids

A continuation, a branch and a writer's edit that keeps the start of its parent's text begin with ids their family
already wrote. The worker resumes the family's run after them (the windows, and the cache values, of the run that
wrote them) instead of prefilling them as a new prompt, so the text goes on as that run would have written it.
Drafts made before this revision have none (NULL): all of their prompt ids are prompt.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 20:30:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0008'
down_revision: Union[str, Sequence[str], None] = '0007'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('resume_from', sa.Integer(), nullable=True))


def downgrade() -> None:
    """Downgrade schema."""
    with op.batch_alter_table('generations', schema=None) as batch_op:
        batch_op.drop_column('resume_from')
