"""a book's plan: its premise, its characters and its chapters

A book (a session of kind "book") gets a premise; its characters (name, description, key words: they become the
World Info of its chapter drafts) and its chapters (title, beats, and the draft that is the chapter's text) are
rows of their own, in the order the writer gives them (position). A chapter whose draft is deleted is not written
again (draft_id NULL); deleting the book deletes its plan.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 21:00:00

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa


# revision identifiers, used by Alembic.
revision: str = '0009'
down_revision: Union[str, Sequence[str], None] = '0008'
branch_labels: Union[str, Sequence[str], None] = None
depends_on: Union[str, Sequence[str], None] = None


def upgrade() -> None:
    """Upgrade schema."""
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('premise', sa.Text(), nullable=False, server_default=''))
    op.create_table('characters',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('session_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('keys', sa.Text(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_characters_session_id_sessions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_characters'))
    )
    with op.batch_alter_table('characters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_characters_session_id'), ['session_id'], unique=False)
    op.create_table('chapters',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('session_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('title', sa.String(length=500), nullable=False),
    sa.Column('beats', sa.Text(), nullable=False),
    sa.Column('draft_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], name=op.f('fk_chapters_session_id_sessions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['draft_id'], ['generations.id'], name=op.f('fk_chapters_draft_id_generations'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_chapters'))
    )
    with op.batch_alter_table('chapters', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_chapters_session_id'), ['session_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_chapters_draft_id'), ['draft_id'], unique=False)


def downgrade() -> None:
    """Downgrade schema."""
    op.drop_table('chapters')
    op.drop_table('characters')
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('premise')
